// SPDX-License-Identifier: GPL-2.0
/*
 * PAMS data plane in the kernel: the pipeline of ../pams.p4 as a tc (clsact) program.
 *
 * Attached to the ingress of every port of the switch namespace (and, counting only, to
 * their egress). A QoS 0, retain 0 MQTT-SN PUBLISH sent to the broker whose
 * (topic id type, topic id) is in `topic_table` is cloned to every subscriber of the
 * entry with the broker as its source, and the original is dropped: the broker never
 * sees it. SUBSCRIBE, UNSUBSCRIBE, SUBACK, REGISTER and DISCONNECT to or from the
 * broker are also cloned to the CPU port (packet-in for the controller). Everything
 * else, malformed MQTT-SN included, goes on to the bridge untouched.
 *
 * Names kept in step with pams.p4 and pams.p4info.txtpb (tests/test_p4_reference.py):
 * the maps topic_table, broker_config, pams_counters, port_counters; the key fields
 * topic_id_type, topic_id; the CNT_* counter indices.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

/* A topic with more subscribers than this is not accelerated: the table writer removes
 * its entry, so its PUBLISHes go through the broker to every subscriber. */
#define MAX_SUBSCRIBERS 64

#define MQTTSN_REGISTER    0x0A
#define MQTTSN_PUBLISH     0x0C
#define MQTTSN_SUBSCRIBE   0x12
#define MQTTSN_SUBACK      0x13
#define MQTTSN_UNSUBSCRIBE 0x14
#define MQTTSN_DISCONNECT  0x18

#define FLAG_QOS_MASK      0x60
#define FLAG_RETAIN        0x10
#define FLAG_TOPIC_ID_TYPE 0x03
/* Will and CleanSession mean nothing in a PUBLISH: set, the broker's codec refuses it. */
#define FLAG_PUBLISH_UNUSED 0x0C

/* Fixed offsets: Ethernet II, IPv4 without options (others are passed, unaccelerated). */
#define OFF_ETH_DST   0
#define OFF_ETH_SRC   6
#define OFF_IP_CSUM   (ETH_HLEN + 10)
#define OFF_IP_SRC    (ETH_HLEN + 12)
#define OFF_IP_DST    (ETH_HLEN + 16)
#define OFF_UDP       (ETH_HLEN + 20)
#define OFF_UDP_SPORT (OFF_UDP + 0)
#define OFF_UDP_DPORT (OFF_UDP + 2)
#define OFF_UDP_CSUM  (OFF_UDP + 6)
#define OFF_MQTTSN    (OFF_UDP + 8)
/* Longest MQTT-SN header read: 3-byte length, type, flags, topic id. */
#define MQTTSN_PEEK   7

enum pams_counter {
	CNT_PACKETS = 0,          /* every packet entering the switch */
	CNT_MQTTSN = 1,           /* UDP datagrams to or from the broker's address and port */
	CNT_PUBLISH_ACCELERATED = 2,
	CNT_CLONES_SENT = 3,
	CNT_CLONE_ERRORS = 4,
	CNT_PUNTED = 5,           /* control messages copied to the CPU port */
	CNT_MALFORMED = 6,
	CNT_PASSED = 7,           /* handed on to the bridge */
	CNT_COUNT = 8,
};

enum port_direction { DIR_INGRESS = 0, DIR_EGRESS = 1 };

struct topic_key {
	__u8 topic_id_type;
	__u8 pad;                 /* always zero: part of the hashed key */
	__be16 topic_id;
};

struct subscriber {
	__u32 ifindex;            /* switch port the subscriber hangs off */
	__be32 ip;
	__be16 port;
	__u8 mac[ETH_ALEN];
};

struct topic_entry {
	__u32 count;
	struct subscriber subs[MAX_SUBSCRIBERS];
};

struct broker_cfg {
	__be32 ip;
	__be16 port;
	__u8 mac[ETH_ALEN];
	__u32 cpu_ifindex;        /* 0: no controller listening */
	__u32 accelerate;         /* 0: the switch only forwards */
};

struct port_key {
	__u32 ifindex;
	__u32 direction;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct topic_key);
	__type(value, struct topic_entry);
} topic_table SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct broker_cfg);
} broker_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CNT_COUNT);
	__type(key, __u32);
	__type(value, __u64);
} pams_counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 256);
	__type(key, struct port_key);
	__type(value, __u64);
} port_counters SEC(".maps");

static __always_inline void count(__u32 index)
{
	__u64 *value = bpf_map_lookup_elem(&pams_counters, &index);

	if (value)
		*value += 1;
}

static __always_inline void count_port(__u32 ifindex, __u32 direction)
{
	struct port_key key = { .ifindex = ifindex, .direction = direction };
	__u64 *value = bpf_map_lookup_elem(&port_counters, &key);
	__u64 one = 1;

	if (value)
		*value += 1;
	else
		bpf_map_update_elem(&port_counters, &key, &one, BPF_NOEXIST);
}

static __always_inline int pass(void)
{
	count(CNT_PASSED);
	return TC_ACT_OK;
}

/* The MQTT-SN header of a datagram, checked against its UDP length. */
struct mqttsn_header {
	__u32 length;             /* whole message, as its length field says */
	__u32 header_len;         /* 1 or 3 */
	__u8 type;
	__u8 flags;               /* PUBLISH and SUBSCRIBE only */
	__be16 topic_id;          /* PUBLISH only */
};

/* Smallest valid length after the length field, per message type (MQTT-SN 1.2 §5.4). */
static __always_inline int body_fits(__u8 type, __u32 body)
{
	switch (type) {
	case MQTTSN_PUBLISH:     return body >= 6;  /* type flags topic(2) msgid(2) */
	case MQTTSN_SUBACK:      return body == 7;  /* type flags topic(2) msgid(2) rc */
	case MQTTSN_SUBSCRIBE:
	case MQTTSN_UNSUBSCRIBE: return body >= 5;  /* type flags msgid(2) topic(>=1) */
	case MQTTSN_REGISTER:    return body >= 6;  /* type topic(2) msgid(2) name(>=1) */
	case MQTTSN_DISCONNECT:  return body == 1 || body == 3;
	default:                 return body >= 1;
	}
}

/* Parse the MQTT-SN header at OFF_MQTTSN; return 0, or -1 if the datagram is malformed. */
static __always_inline int parse_mqttsn(struct __sk_buff *skb, __u32 payload_len,
					struct mqttsn_header *h)
{
	__u8 peek[MQTTSN_PEEK] = {};  /* bytes past the datagram's end read as zero */
	__u32 avail = payload_len < MQTTSN_PEEK ? payload_len : MQTTSN_PEEK;

	if (avail < 2 || avail > MQTTSN_PEEK || bpf_skb_load_bytes(skb, OFF_MQTTSN, peek, avail))
		return -1;
	if (peek[0] == 0x01) {
		h->length = ((__u32)peek[1] << 8) | peek[2];
		h->header_len = 3;
	} else {
		h->length = peek[0];
		h->header_len = 1;
	}
	if (h->length == 0 || h->length != payload_len || h->length < h->header_len + 1)
		return -1;
	/* The 3-byte form is only for messages longer than 255 octets (MQTT-SN 1.2, 5.2.1). */
	if (h->header_len == 3 && h->length <= 255)
		return -1;
	if (h->header_len == 3) {
		h->type = peek[3];
		h->flags = peek[4];
		__builtin_memcpy(&h->topic_id, &peek[5], sizeof(h->topic_id));
	} else {
		h->type = peek[1];
		h->flags = peek[2];
		__builtin_memcpy(&h->topic_id, &peek[3], sizeof(h->topic_id));
	}
	return body_fits(h->type, h->length - h->header_len) ? 0 : -1;
}

static __always_inline int is_control(__u8 type)
{
	return type == MQTTSN_SUBSCRIBE || type == MQTTSN_UNSUBSCRIBE || type == MQTTSN_SUBACK ||
	       type == MQTTSN_REGISTER || type == MQTTSN_DISCONNECT;
}

/* Rewrite one 4-byte IPv4 address, fixing the IPv4 and the UDP (pseudo-header) checksum. */
static __always_inline void set_addr(struct __sk_buff *skb, __u32 offset, __be32 old, __be32 new)
{
	bpf_l3_csum_replace(skb, OFF_IP_CSUM, old, new, sizeof(new));
	bpf_l4_csum_replace(skb, OFF_UDP_CSUM, old, new,
			    BPF_F_PSEUDO_HDR | BPF_F_MARK_MANGLED_0 | sizeof(new));
	bpf_skb_store_bytes(skb, offset, &new, sizeof(new), 0);
}

static __always_inline void set_port(struct __sk_buff *skb, __u32 offset, __be16 old, __be16 new)
{
	bpf_l4_csum_replace(skb, OFF_UDP_CSUM, old, new, BPF_F_MARK_MANGLED_0 | sizeof(new));
	bpf_skb_store_bytes(skb, offset, &new, sizeof(new), 0);
}

/* Send one copy of the PUBLISH to each subscriber, as if from the broker; drop the original. */
static __always_inline int accelerate(struct __sk_buff *skb, const struct broker_cfg *cfg,
				      const struct topic_entry *entry, __be32 saddr, __be32 daddr,
				      __be16 sport, __be16 dport)
{
	__u32 n = entry->count;

	count(CNT_PUBLISH_ACCELERATED);
	bpf_skb_store_bytes(skb, OFF_ETH_SRC, cfg->mac, ETH_ALEN, 0);
	set_addr(skb, OFF_IP_SRC, saddr, cfg->ip);
	set_port(skb, OFF_UDP_SPORT, sport, cfg->port);
	for (__u32 i = 0; i < MAX_SUBSCRIBERS; i++) {
		const struct subscriber *sub = &entry->subs[i];

		if (i >= n)
			break;
		bpf_skb_store_bytes(skb, OFF_ETH_DST, sub->mac, ETH_ALEN, 0);
		set_addr(skb, OFF_IP_DST, daddr, sub->ip);
		daddr = sub->ip;
		set_port(skb, OFF_UDP_DPORT, dport, sub->port);
		dport = sub->port;
		count(bpf_clone_redirect(skb, sub->ifindex, 0) == 0 ? CNT_CLONES_SENT
								    : CNT_CLONE_ERRORS);
	}
	return TC_ACT_SHOT;
}

SEC("tc")
int pams_ingress(struct __sk_buff *skb)
{
	__u32 zero = 0;
	struct broker_cfg *cfg;
	struct mqttsn_header h;
	struct topic_key key = {};
	struct topic_entry *entry;
	struct iphdr *ip;
	struct udphdr *udp;
	void *data, *data_end;
	__u32 payload_len, udp_len;
	int to_broker;

	count(CNT_PACKETS);
	count_port(skb->ifindex, DIR_INGRESS);
	cfg = bpf_map_lookup_elem(&broker_config, &zero);
	if (!cfg || skb->protocol != bpf_htons(ETH_P_IP))
		return pass();
	bpf_skb_pull_data(skb, OFF_MQTTSN);
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	if (data + OFF_MQTTSN > data_end)
		return pass();
	ip = data + ETH_HLEN;
	udp = data + OFF_UDP;
	if (ip->ihl != 5 || ip->protocol != IPPROTO_UDP || (ip->frag_off & bpf_htons(0x3FFF)))
		return pass();
	to_broker = ip->daddr == cfg->ip && udp->dest == cfg->port;
	if (!to_broker && !(ip->saddr == cfg->ip && udp->source == cfg->port))
		return pass();
	count(CNT_MQTTSN);
	udp_len = bpf_ntohs(udp->len);
	if (udp_len < sizeof(*udp) || OFF_UDP + udp_len > skb->len ||
	    ETH_HLEN + bpf_ntohs(ip->tot_len) > skb->len) {
		count(CNT_MALFORMED);
		return pass();
	}
	payload_len = udp_len - sizeof(*udp);
	/* Keep what the helpers below need; `ip` and `udp` are invalid after the first one. */
	__be32 saddr = ip->saddr, daddr = ip->daddr;
	__be16 sport = udp->source, dport = udp->dest;

	if (parse_mqttsn(skb, payload_len, &h)) {
		count(CNT_MALFORMED);
		return pass();
	}
	if (is_control(h.type) && cfg->cpu_ifindex) {
		count(bpf_clone_redirect(skb, cfg->cpu_ifindex, 0) == 0 ? CNT_PUNTED
									 : CNT_CLONE_ERRORS);
		return pass();
	}
	if (!to_broker || h.type != MQTTSN_PUBLISH || !cfg->accelerate ||
	    (h.flags & (FLAG_QOS_MASK | FLAG_RETAIN | FLAG_PUBLISH_UNUSED)))
		return pass();
	key.topic_id_type = h.flags & FLAG_TOPIC_ID_TYPE;
	key.topic_id = h.topic_id;
	entry = bpf_map_lookup_elem(&topic_table, &key);
	if (!entry || entry->count == 0)
		return pass();
	return accelerate(skb, cfg, entry, saddr, daddr, sport, dport);
}

SEC("tc")
int pams_egress(struct __sk_buff *skb)
{
	count_port(skb->ifindex, DIR_EGRESS);
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "GPL";

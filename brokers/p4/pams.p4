/*
 * PAMS: P4-based acceleration of MQTT-SN, P4_16 for the v1model architecture (BMv2).
 *
 * NEVER COMPILED HERE. No P4 compiler (p4c) or P4 switch can be installed on the machine
 * mqttbed is developed on; this program is the reference for a BMv2 or Tofino deployment,
 * written against the P4_16 and v1model specifications. The pipeline that actually runs
 * and is tested is its eBPF twin, ebpf/pams.bpf.c. Its P4Info, pams.p4info.txtpb, is
 * written by hand to match it (ids assigned by hand, not by p4c).
 * tests/test_p4_reference.py keeps the table, action, counter and key-field names of the
 * three in step.
 *
 * Ingress: a QoS 0, retain 0 MQTT-SN PUBLISH to the broker whose (topic_id_type,
 * topic_id) hits topic_table gets the topic's multicast group and is not forwarded to
 * the broker. Egress: each replica's egress_rid selects the subscriber it is rewritten
 * for (subscriber_rewrite), with the broker as source. SUBSCRIBE, UNSUBSCRIBE, SUBACK,
 * REGISTER and DISCONNECT to or from the broker are cloned to the CPU port with a
 * packet_in header. Everything else, malformed MQTT-SN included, is L2-forwarded.
 *
 * One difference from the eBPF program: the rewrite sets the UDP checksum to 0 (allowed
 * for UDP over IPv4) where the eBPF program updates it incrementally.
 */
#include <core.p4>
#include <v1model.p4>

const bit<16> ETHERTYPE_IPV4 = 0x0800;
const bit<8>  IPPROTO_UDP = 17;
const bit<9>  CPU_PORT = 255;
const bit<32> CPU_CLONE_SESSION = 100;
const bit<16> FLOOD_GROUP = 0xFFFF;
const bit<8>  CPU_FIELD_LIST = 1;
const bit<32> PKT_INSTANCE_TYPE_INGRESS_CLONE = 1;

const bit<8> MQTTSN_REGISTER    = 0x0A;
const bit<8> MQTTSN_PUBLISH     = 0x0C;
const bit<8> MQTTSN_SUBSCRIBE   = 0x12;
const bit<8> MQTTSN_SUBACK      = 0x13;
const bit<8> MQTTSN_UNSUBSCRIBE = 0x14;
const bit<8> MQTTSN_DISCONNECT  = 0x18;

/* pams_counters indices, in step with enum pams_counter in ebpf/pams.bpf.c. */
const bit<32> CNT_PACKETS = 0;
const bit<32> CNT_MQTTSN = 1;
const bit<32> CNT_PUBLISH_ACCELERATED = 2;
const bit<32> CNT_CLONES_SENT = 3;
const bit<32> CNT_CLONE_ERRORS = 4;
const bit<32> CNT_PUNTED = 5;
const bit<32> CNT_MALFORMED = 6;
const bit<32> CNT_PASSED = 7;
const bit<32> CNT_COUNT = 8;

/* port_counters index: port * 2 + direction. */
const bit<32> DIR_INGRESS = 0;
const bit<32> DIR_EGRESS = 1;

header ethernet_t {
    bit<48> dst_addr;
    bit<48> src_addr;
    bit<16> ether_type;
}

header ipv4_t {
    bit<4>  version;
    bit<4>  ihl;
    bit<8>  diffserv;
    bit<16> total_len;
    bit<16> identification;
    bit<3>  flags;
    bit<13> frag_offset;
    bit<8>  ttl;
    bit<8>  protocol;
    bit<16> hdr_checksum;
    bit<32> src_addr;
    bit<32> dst_addr;
}

header udp_t {
    bit<16> src_port;
    bit<16> dst_port;
    bit<16> length;
    bit<16> checksum;
}

/* MQTT-SN length: one byte, or 0x01 followed by two bytes (MQTT-SN 1.2, 5.2.1). */
header mqttsn_len1_t {
    bit<8> length;
}

header mqttsn_len3_t {
    bit<8>  marker;
    bit<16> length;
}

header mqttsn_type_t {
    bit<8> msg_type;
}

header mqttsn_publish_t {
    bit<1>  dup;
    bit<2>  qos;
    bit<1>  retain;
    bit<1>  will;
    bit<1>  clean_session;
    bit<2>  topic_id_type;
    bit<16> topic_id;
    bit<16> msg_id;
}

@controller_header("packet_in")
header packet_in_t {
    bit<9> ingress_port;
    bit<7> pad;
}

struct headers_t {
    packet_in_t      packet_in;
    ethernet_t       ethernet;
    ipv4_t           ipv4;
    udp_t            udp;
    mqttsn_len1_t    len1;
    mqttsn_len3_t    len3;
    mqttsn_type_t    mqttsn;
    mqttsn_publish_t publish;
}

struct metadata_t {
    bit<32> broker_ip;
    bit<16> broker_port;
    bit<48> broker_mac;
    bit<1>  accelerate_on;
    bit<1>  accelerated;
    @field_list(CPU_FIELD_LIST)
    bit<9>  ingress_port;
}

parser PamsParser(packet_in packet, out headers_t hdr, inout metadata_t meta,
                  inout standard_metadata_t standard_metadata) {
    state start {
        packet.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            ETHERTYPE_IPV4: parse_ipv4;
            default: accept;
        }
    }
    state parse_ipv4 {
        packet.extract(hdr.ipv4);
        transition select(hdr.ipv4.ihl, hdr.ipv4.frag_offset, hdr.ipv4.protocol) {
            (5, 0, IPPROTO_UDP): parse_udp;
            default: accept;
        }
    }
    state parse_udp {
        packet.extract(hdr.udp);
        transition select(packet.lookahead<bit<8>>()) {
            0x01: parse_len3;
            default: parse_len1;
        }
    }
    state parse_len1 {
        packet.extract(hdr.len1);
        transition parse_type;
    }
    state parse_len3 {
        packet.extract(hdr.len3);
        transition parse_type;
    }
    state parse_type {
        packet.extract(hdr.mqttsn);
        transition select(hdr.mqttsn.msg_type) {
            MQTTSN_PUBLISH: parse_publish;
            default: accept;
        }
    }
    state parse_publish {
        packet.extract(hdr.publish);
        transition accept;
    }
}

control PamsVerifyChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply { }
}

control PamsIngress(inout headers_t hdr, inout metadata_t meta,
                    inout standard_metadata_t standard_metadata) {
    counter(CNT_COUNT, CounterType.packets) pams_counters;
    counter(1024, CounterType.packets) port_counters;

    action set_broker(bit<32> broker_ip, bit<16> broker_port, bit<48> broker_mac,
                      bit<1> accelerate) {
        meta.broker_ip = broker_ip;
        meta.broker_port = broker_port;
        meta.broker_mac = broker_mac;
        meta.accelerate_on = accelerate;
    }

    /* No key: the controller sets the default action, as the eBPF broker_config map. */
    table broker_config {
        actions = { set_broker; NoAction; }
        default_action = NoAction();
    }

    action accelerate(bit<16> mcast_grp) {
        standard_metadata.mcast_grp = mcast_grp;
        meta.accelerated = 1;
    }

    table topic_table {
        key = {
            hdr.publish.topic_id_type: exact;
            hdr.publish.topic_id: exact;
        }
        actions = { accelerate; NoAction; }
        default_action = NoAction();
        size = 4096;
    }

    action forward(bit<9> port) {
        standard_metadata.egress_spec = port;
    }

    action flood() {
        standard_metadata.mcast_grp = FLOOD_GROUP;
    }

    table l2_forward {
        key = { hdr.ethernet.dst_addr: exact; }
        actions = { forward; flood; }
        default_action = flood();
        size = 1024;
    }

    action punt() {
        meta.ingress_port = standard_metadata.ingress_port;
        clone_preserving_field_list(CloneType.I2E, CPU_CLONE_SESSION, CPU_FIELD_LIST);
        pams_counters.count(CNT_PUNTED);
    }

    apply {
        pams_counters.count(CNT_PACKETS);
        port_counters.count((bit<32>)standard_metadata.ingress_port * 2 + DIR_INGRESS);
        broker_config.apply();
        bool to_broker = hdr.udp.isValid() && hdr.ipv4.dst_addr == meta.broker_ip
                         && hdr.udp.dst_port == meta.broker_port;
        bool from_broker = hdr.udp.isValid() && hdr.ipv4.src_addr == meta.broker_ip
                           && hdr.udp.src_port == meta.broker_port;
        if (to_broker || from_broker) {
            pams_counters.count(CNT_MQTTSN);
            bit<16> length = hdr.len3.isValid() ? hdr.len3.length : (bit<16>)hdr.len1.length;
            /* The 3-byte length form is only for messages longer than 255 octets. */
            if (standard_metadata.parser_error != error.NoError
                    || !hdr.mqttsn.isValid() || length != hdr.udp.length - 8
                    || (hdr.len3.isValid() && length <= 255)) {
                pams_counters.count(CNT_MALFORMED);
            } else if (hdr.mqttsn.msg_type == MQTTSN_SUBSCRIBE
                    || hdr.mqttsn.msg_type == MQTTSN_UNSUBSCRIBE
                    || hdr.mqttsn.msg_type == MQTTSN_SUBACK
                    || hdr.mqttsn.msg_type == MQTTSN_REGISTER
                    || hdr.mqttsn.msg_type == MQTTSN_DISCONNECT) {
                punt();
            } else if (to_broker && hdr.publish.isValid() && meta.accelerate_on == 1
                    && hdr.publish.qos == 0 && hdr.publish.retain == 0
                    && hdr.publish.will == 0 && hdr.publish.clean_session == 0) {
                if (topic_table.apply().hit) {
                    pams_counters.count(CNT_PUBLISH_ACCELERATED);
                    return;
                }
            }
        }
        pams_counters.count(CNT_PASSED);
        l2_forward.apply();
    }
}

control PamsEgress(inout headers_t hdr, inout metadata_t meta,
                   inout standard_metadata_t standard_metadata) {
    counter(CNT_COUNT, CounterType.packets) egress_counters;
    counter(1024, CounterType.packets) egress_port_counters;

    action rewrite_to_subscriber(bit<48> dst_mac, bit<32> dst_ip, bit<16> dst_port) {
        hdr.ethernet.src_addr = meta.broker_mac;
        hdr.ethernet.dst_addr = dst_mac;
        hdr.ipv4.src_addr = meta.broker_ip;
        hdr.ipv4.dst_addr = dst_ip;
        hdr.udp.src_port = meta.broker_port;
        hdr.udp.dst_port = dst_port;
        hdr.udp.checksum = 0;
    }

    /* One entry per subscriber: the replica id its copies carry in the topic's group. */
    table subscriber_rewrite {
        key = { standard_metadata.egress_rid: exact; }
        actions = { rewrite_to_subscriber; NoAction; }
        default_action = NoAction();
        size = 65536;
    }

    apply {
        egress_port_counters.count((bit<32>)standard_metadata.egress_port * 2 + DIR_EGRESS);
        if (standard_metadata.instance_type == PKT_INSTANCE_TYPE_INGRESS_CLONE) {
            hdr.packet_in.setValid();
            hdr.packet_in.ingress_port = meta.ingress_port;
        } else if (meta.accelerated == 1) {
            if (subscriber_rewrite.apply().hit) {
                egress_counters.count(CNT_CLONES_SENT);
            } else {
                egress_counters.count(CNT_CLONE_ERRORS);
                mark_to_drop(standard_metadata);
            }
        }
    }
}

control PamsComputeChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply {
        update_checksum(hdr.ipv4.isValid(),
            { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.diffserv, hdr.ipv4.total_len,
              hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.frag_offset, hdr.ipv4.ttl,
              hdr.ipv4.protocol, hdr.ipv4.src_addr, hdr.ipv4.dst_addr },
            hdr.ipv4.hdr_checksum, HashAlgorithm.csum16);
    }
}

control PamsDeparser(packet_out packet, in headers_t hdr) {
    apply {
        packet.emit(hdr.packet_in);
        packet.emit(hdr.ethernet);
        packet.emit(hdr.ipv4);
        packet.emit(hdr.udp);
        packet.emit(hdr.len1);
        packet.emit(hdr.len3);
        packet.emit(hdr.mqttsn);
        packet.emit(hdr.publish);
    }
}

V1Switch(PamsParser(), PamsVerifyChecksum(), PamsIngress(), PamsEgress(),
         PamsComputeChecksum(), PamsDeparser()) main;

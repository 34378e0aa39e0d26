// mqttbed-fpga-rtl: the Verilated FPGA broker (mqtt_broker.v) behind a real UDP socket.
//
// Each datagram received is driven into s_axis one beat per clock, W bytes a beat (the
// design's width, kBeat below; tkeep marks the bytes of the last beat; source address and
// port in tuser); the design is clocked until it is idle again, and every packet it puts
// out on m_axis is sent as one datagram to the address and port in its tuser. The clock only runs
// while there is work, so an idle broker costs no CPU. Per packet answered it records the
// design's cycles from the first beat in to the last beat of each copy out (receive to
// send, as the paper's 799.2 ns), and the harness's own measured time from recvfrom to each
// sendto (CLOCK_MONOTONIC).
//
//   mqttbed-fpga-rtl --port N [--host A] [--ready-file F] [--stats-file F]
//                    [--records-file F] [--io-file F] [--clock-mhz 100]
//   mqttbed-fpga-rtl --bench N        N PUBLISH packets to 1 subscriber, no socket: prints
//                                      packets/s through the design and cycles per packet
//   mqttbed-fpga-rtl --bench-stream N  the same back to back (one-level topic), no idle
//                                      between packets: the design's own rate
//
// SIGTERM/SIGINT: write the stats and records files, exit 0. SIGUSR1: write stats only.
#include <arpa/inet.h>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <poll.h>
#include <string>
#include <sys/socket.h>
#include <unistd.h>
#include <vector>

#include "Vmqtt_broker.h"
#include "verilated.h"

namespace {

// Bytes per beat: the width of tkeep (Verilator stores a signal least significant byte
// first, as an integer or an array of 32-bit words: a beat's bytes are copied in and out).
constexpr size_t kBeat = sizeof(Vmqtt_broker::s_axis_tkeep) * 8;
static_assert(sizeof(Vmqtt_broker::s_axis_tdata) == kBeat, "tdata is W bytes");
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "signals are copied bytewise");

template <typename T>
void put_bytes(T& signal, const uint8_t* bytes, size_t n) {
    std::memset(&signal, 0, sizeof signal);
    std::memcpy(&signal, bytes, n);
}

template <typename T>
void put_keep(T& signal, size_t n) {
    uint8_t mask[sizeof signal] = {};
    for (size_t i = 0; i < n; i++) mask[i / 8] |= uint8_t(1u << (i % 8));
    std::memcpy(&signal, mask, sizeof signal);
}

template <typename T>
size_t keep_count(const T& signal) {     // the low lanes in use
    uint8_t mask[sizeof signal];
    std::memcpy(mask, &signal, sizeof signal);
    size_t n = 0;
    while (n < kBeat && (mask[n / 8] >> (n % 8) & 1)) n++;
    return n;
}

constexpr size_t kMaxDatagram = 65535;
constexpr size_t kSamplesKept = 200000;
constexpr long kIoIntervalNs = 50000000;
// No datagram needs this many cycles (a DISCONNECT's walk is 65,536 words, 4,095 IDs a
// scan): past it the design is stuck, and the harness exits rather than spin.
constexpr uint64_t kMaxCyclesPerDatagram = 50000000;

volatile std::sig_atomic_t g_stop = 0;
volatile std::sig_atomic_t g_dump = 0;

long now_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

struct Output {
    std::vector<uint8_t> bytes;
    uint64_t dest;          // {ip, port}
    uint64_t done_cycle;    // cycle its last beat left the design
};

// Per packet kind, the kept per-packet values (oldest dropped past kSamplesKept).
struct LatencyLog {
    uint64_t packets = 0;
    std::map<std::string, std::vector<double>> columns;
    void add(const std::map<std::string, double>& row) {
        packets++;
        for (const auto& [name, value] : row) {
            auto& column = columns[name];
            if (column.size() >= kSamplesKept) column.erase(column.begin());
            column.push_back(value);
        }
    }
};

class Broker {
public:
    explicit Broker(double clock_mhz) : cycle_ns_(1000.0 / clock_mhz) {
        top_.m_axis_tready = 1;
        top_.s_axis_tvalid = 0;
        top_.rst = 1;
        for (int i = 0; i < 4; i++) tick();
        top_.rst = 0;
        tick();
    }

    // Drive one datagram in and clock until the design is idle; return what it sent.
    std::vector<Output> handle(const uint8_t* data, size_t len, uint32_t ip, uint16_t port,
                               uint64_t* first_in_cycle) {
        outputs_.clear();
        *first_in_cycle = cycle_;
        drive(data, len, (uint64_t(ip) << 16) | port);
        return finish();
    }

    // Drive the same datagram `count` times back to back (the next one's first beat in the
    // cycle after the last one's last beat is taken), then clock until idle; return what it
    // sent. The harness's own loop waits for idle after each datagram; this is the design's
    // rate.
    std::vector<Output> stream(const uint8_t* data, size_t len, long count, uint32_t ip,
                               uint16_t port) {
        outputs_.clear();
        for (long k = 0; k < count; k++) drive(data, len, (uint64_t(ip) << 16) | port);
        return finish();
    }

    double cycle_ns() const { return cycle_ns_; }
    uint64_t cycles() const { return cycle_; }
    uint32_t dropped_malformed() const { return top_.dropped_malformed; }
    uint32_t dropped_limit() const { return top_.dropped_limit; }

private:
    // One datagram into s_axis, a beat per cycle while the design takes them.
    void drive(const uint8_t* data, size_t len, uint64_t user) {
        for (size_t i = 0; i < len;) {
            size_t n = len - i < kBeat ? len - i : kBeat;
            top_.s_axis_tvalid = 1;
            put_bytes(top_.s_axis_tdata, data + i, n);
            put_keep(top_.s_axis_tkeep, n);
            top_.s_axis_tlast = i + n == len;
            top_.s_axis_tuser = user;
            top_.clk = 0;
            top_.eval();
            bool accepted = top_.s_axis_tready;
            tick();
            if (accepted) i += n;
        }
        top_.s_axis_tvalid = 0;
        top_.s_axis_tlast = 0;
    }

    // Clock until the design is idle; what it sent meanwhile.
    std::vector<Output> finish() {
        uint64_t start = cycle_;
        do {
            tick();
            if (cycle_ - start > kMaxCyclesPerDatagram) {
                std::fprintf(stderr, "mqttbed-fpga-rtl: the design is not idle %llu cycles "
                             "after a datagram: stuck\n", (unsigned long long)kMaxCyclesPerDatagram);
                std::exit(3);
            }
        } while (top_.busy || top_.m_axis_tvalid);
        return std::move(outputs_);
    }

    // One clock: outputs are taken before the rising edge, as the next stage would.
    void tick() {
        top_.clk = 0;
        top_.eval();
        if (top_.m_axis_tvalid && top_.m_axis_tready) {
            if (!in_packet_) {
                outputs_.push_back(Output{{}, top_.m_axis_tuser, 0});
                in_packet_ = true;
            }
            auto& bytes = outputs_.back().bytes;
            size_t n = keep_count(top_.m_axis_tkeep);
            bytes.resize(bytes.size() + n);
            std::memcpy(bytes.data() + bytes.size() - n, &top_.m_axis_tdata, n);
            if (top_.m_axis_tlast) {
                outputs_.back().done_cycle = cycle_;
                in_packet_ = false;
            }
        }
        top_.clk = 1;
        top_.eval();
        cycle_++;
    }

    Vmqtt_broker top_;
    double cycle_ns_;
    uint64_t cycle_ = 0;
    bool in_packet_ = false;
    std::vector<Output> outputs_;
};

const char* kind_of(uint8_t first) {
    switch (first >> 4) {
        case 1: return "connect";
        case 3: return "publish";
        case 8: return "subscribe";
        case 10: return "unsubscribe";
        case 12: return "pingreq";
        default: return "other";
    }
}

void write_atomically(const std::string& path, const std::string& text) {
    std::string tmp = path + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "w");
    if (!f) return;
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
    std::rename(tmp.c_str(), path.c_str());
}

std::string json_number(double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    return buf;
}

struct Counters {
    uint64_t datagrams_in = 0, bytes_in = 0, datagrams_out = 0, bytes_out = 0;
    uint64_t send_errors = 0, receive_errors = 0;
};

std::string stats_json(const Counters& c, const Broker& b, const std::string& host, int port,
                       double clock_mhz) {
    std::string s = "{\"format\": 1, \"model\": \"fpga-rtl\", \"pid\": " +
                    std::to_string(getpid()) + ", \"address\": \"" + host + ":" +
                    std::to_string(port) + "\", \"clock_mhz\": " + json_number(clock_mhz) +
                    ", \"counters\": {";
    s += "\"datagrams_in\": " + std::to_string(c.datagrams_in);
    s += ", \"bytes_in\": " + std::to_string(c.bytes_in);
    s += ", \"datagrams_out\": " + std::to_string(c.datagrams_out);
    s += ", \"bytes_out\": " + std::to_string(c.bytes_out);
    s += ", \"send_errors\": " + std::to_string(c.send_errors);
    s += ", \"receive_errors\": " + std::to_string(c.receive_errors);
    s += ", \"dropped_malformed\": " + std::to_string(b.dropped_malformed());
    s += ", \"dropped_limit\": " + std::to_string(b.dropped_limit());
    s += ", \"cycles\": " + std::to_string(b.cycles());
    s += "}}\n";
    return s;
}

std::string records_json(const std::map<std::string, LatencyLog>& logs) {
    std::string s = "{";
    bool first_kind = true;
    for (const auto& [kind, log] : logs) {
        s += (first_kind ? "\"" : ", \"") + kind + "\": {\"packets\": " +
             std::to_string(log.packets) + ", \"values\": {";
        first_kind = false;
        bool first_col = true;
        for (const auto& [name, column] : log.columns) {
            s += (first_col ? "\"" : ", \"") + name + "\": [";
            first_col = false;
            for (size_t i = 0; i < column.size(); i++)
                s += (i ? ", " : "") + json_number(column[i]);
            s += "]";
        }
        s += "}}";
    }
    return s + "}\n";
}

// --bench and --bench-stream: `count` 76-byte PUBLISHes of `topic` to one subscriber, no
// sockets: one at a time, each clocked to idle (as the harness serves datagrams), or back
// to back without waiting (the design's own rate). --bench uses `sync/pmu`, --bench-stream
// a one-level topic (`pmu`: one name, the paper's one-PUBLISH-per-cycle case).
int bench(long count, const std::string& topic, bool back_to_back) {
    Broker broker(100.0);
    uint64_t first;
    const uint8_t n = uint8_t(topic.size());
    std::vector<uint8_t> subscribe = {0x82, uint8_t(5 + n), 0x00, 0x01, 0x00, n};
    subscribe.insert(subscribe.end(), topic.begin(), topic.end());
    subscribe.push_back(0x00);
    broker.handle(subscribe.data(), subscribe.size(), 0x7f000001, 40000, &first);
    std::vector<uint8_t> publish = {0x30, 74, 0x00, n};
    publish.insert(publish.end(), topic.begin(), topic.end());
    publish.resize(76, 0x5a);
    long start = now_ns();
    uint64_t start_cycle = broker.cycles();
    uint64_t copies = 0;
    if (back_to_back)
        copies = broker.stream(publish.data(), publish.size(), count, 0x7f000001, 40001).size();
    else
        for (long i = 0; i < count; i++)
            copies += broker.handle(publish.data(), publish.size(), 0x7f000001, 40001, &first).size();
    double seconds = (now_ns() - start) / 1e9;
    std::printf("{\"packets\": %ld, \"copies\": %llu, \"seconds\": %.6f, \"packets_per_s\": %.1f, "
                "\"cycles_per_packet\": %.3f}\n", count, (unsigned long long)copies, seconds,
                count / seconds, double(broker.cycles() - start_cycle) / count);
    return copies == uint64_t(count) ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    Verilated::commandArgs(argc, argv);
    std::string host = "127.0.0.1", ready_file, stats_file, records_file, io_file;
    int port = -1;
    double clock_mhz = 100.0;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) { std::fprintf(stderr, "%s needs a value\n", a.c_str()); std::exit(2); }
            return argv[++i];
        };
        if (a == "--host") host = value();
        else if (a == "--port") port = std::atoi(value().c_str());
        else if (a == "--ready-file") ready_file = value();
        else if (a == "--stats-file") stats_file = value();
        else if (a == "--records-file") records_file = value();
        else if (a == "--io-file") io_file = value();
        else if (a == "--clock-mhz") clock_mhz = std::atof(value().c_str());
        else if (a == "--bench") return bench(std::atol(value().c_str()), "sync/pmu", false);
        else if (a == "--bench-stream") return bench(std::atol(value().c_str()), "pmu", true);
        else if (a.rfind("+verilator", 0) == 0) continue;
        else { std::fprintf(stderr, "mqttbed-fpga-rtl: unknown argument %s\n", a.c_str()); return 2; }
    }
    if (port < 0 || port > 65535) {
        std::fprintf(stderr, "mqttbed-fpga-rtl: --port must be 0..65535, got %d\n", port);
        return 2;
    }
    int sock = socket(AF_INET, SOCK_DGRAM, 0);
    int rcvbuf = 4 << 20;
    setsockopt(sock, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1 ||
        bind(sock, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
        std::fprintf(stderr, "mqttbed-fpga-rtl: cannot bind %s:%d: %s\n", host.c_str(), port,
                     std::strerror(errno));
        return 2;
    }
    socklen_t alen = sizeof addr;
    getsockname(sock, reinterpret_cast<sockaddr*>(&addr), &alen);
    port = ntohs(addr.sin_port);
    std::signal(SIGTERM, [](int) { g_stop = 1; });
    std::signal(SIGINT, [](int) { g_stop = 1; });
    std::signal(SIGUSR1, [](int) { g_dump = 1; });

    Broker broker(clock_mhz);
    Counters counters;
    std::map<std::string, LatencyLog> logs;
    if (!ready_file.empty())
        write_atomically(ready_file, "{\"host\": \"" + host + "\", \"port\": " +
                         std::to_string(port) + ", \"pid\": " + std::to_string(getpid()) + "}\n");
    std::printf("fpga-rtl listening on udp://%s:%d (pid %d)\n", host.c_str(), port, getpid());
    std::fflush(stdout);

    std::vector<uint8_t> buf(kMaxDatagram);
    uint64_t io_written_in = ~0ull, io_written_out = ~0ull;
    long io_written_at = 0;
    auto write_io = [&](bool force) {
        if (io_file.empty()) return;
        if (counters.bytes_in == io_written_in && counters.bytes_out == io_written_out) return;
        long now = now_ns();
        if (!force && now - io_written_at < kIoIntervalNs) return;
        write_atomically(io_file, "{\"bytes_in\": " + std::to_string(counters.bytes_in) +
                         ", \"bytes_out\": " + std::to_string(counters.bytes_out) + "}\n");
        io_written_in = counters.bytes_in;
        io_written_out = counters.bytes_out;
        io_written_at = now;
    };
    write_io(true);
    pollfd pfd{sock, POLLIN, 0};
    bool draining = false;
    while (true) {
        if (g_dump) {
            g_dump = 0;
            if (!stats_file.empty())
                write_atomically(stats_file, stats_json(counters, broker, host, port, clock_mhz));
        }
        if (g_stop) draining = true;
        int ready = poll(&pfd, 1, draining ? 0 : 50);
        if (ready <= 0) {
            write_io(false);
            if (draining) break;
            continue;
        }
        sockaddr_in from{};
        socklen_t flen = sizeof from;
        ssize_t n = recvfrom(sock, buf.data(), buf.size(), MSG_DONTWAIT,
                             reinterpret_cast<sockaddr*>(&from), &flen);
        if (n < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) counters.receive_errors++;
            continue;
        }
        long t_received = now_ns();
        counters.datagrams_in++;
        counters.bytes_in += n;
        if (n == 0) continue;           // no bytes, no AXI4-Stream packet: dropped
        uint64_t first_cycle;
        std::vector<Output> outputs = broker.handle(buf.data(), n, ntohl(from.sin_addr.s_addr),
                                                    ntohs(from.sin_port), &first_cycle);
        // The design's cycle counts are exact; sending happens after simulating, so the
        // measured times include the simulation of the whole packet.
        long t_first = 0, t_last = 0;
        for (const Output& out : outputs) {
            sockaddr_in to{};
            to.sin_family = AF_INET;
            to.sin_addr.s_addr = htonl(uint32_t(out.dest >> 16));
            to.sin_port = htons(uint16_t(out.dest & 0xffff));
            if (sendto(sock, out.bytes.data(), out.bytes.size(), 0,
                       reinterpret_cast<sockaddr*>(&to), sizeof to) < 0) {
                counters.send_errors++;
            } else {
                counters.datagrams_out++;
                counters.bytes_out += out.bytes.size();
            }
            t_last = now_ns();
            if (!t_first) t_first = t_last;
        }
        write_io(false);
        if (outputs.empty()) continue;
        double first_ns = (outputs.front().done_cycle - first_cycle + 1) * broker.cycle_ns();
        double last_ns = (outputs.back().done_cycle - first_cycle + 1) * broker.cycle_ns();
        logs[kind_of(buf[0])].add({
            {"rtl_first_copy", first_ns}, {"rtl_last_copy", last_ns},
            {"rtl_spread", last_ns - first_ns},
            {"rtl_cycles_first_copy", double(outputs.front().done_cycle - first_cycle + 1)},
            {"measured_first_copy", double(t_first - t_received)},
            {"measured_last_copy", double(t_last - t_received)},
            {"measured_spread", double(t_last - t_first)},
            {"copies", double(outputs.size())}});
    }
    write_io(true);
    if (!stats_file.empty())
        write_atomically(stats_file, stats_json(counters, broker, host, port, clock_mhz));
    if (!records_file.empty()) write_atomically(records_file, records_json(logs));
    std::printf("fpga-rtl stopped: %llu datagrams in, %llu out, %u malformed dropped\n",
                (unsigned long long)counters.datagrams_in,
                (unsigned long long)counters.datagrams_out, broker.dropped_malformed());
    close(sock);
    return 0;
}

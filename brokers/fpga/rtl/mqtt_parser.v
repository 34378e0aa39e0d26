// MQTT parser (seed 000, 5.3): dispatcher and `#` rewriter.
//
// Takes one UDP payload per AXI4-Stream packet, W bytes per beat (byte i of the datagram in
// beat i / W, lane i % W, tdata[8*lane +: 8]; tkeep marks the lanes in use: every beat but
// the last is full, the last one's lanes are the low ones), the source IPv4 address and
// port in tuser ({ip[31:0], port[15:0]}). The dispatcher checks the packet as
// core/mqtt_codec.py decode() does (fixed header, remaining length, fields, UTF-8 strings,
// reserved flags; a datagram that is not exactly one well-formed packet is dropped and
// counted). A beat is checked LANES bytes per cycle (the byte checks below are unrolled
// LANES times, a chain as long as the lanes): a beat takes ceil(bytes in it / LANES)
// cycles, one cycle when LANES == W. A PUBLISH's beats are written into the message queue
// whole, as they arrive (one queue entry per beat); only once the last byte has been checked
// does the parser issue the packet to the lookup engine, as a descriptor stream: one beat
// per name to look up, each {header, name} (mqtt_defs.vh), one beat for a packet without
// names.
//
// Fast path (mqtt_parser_fast.v, FAST_ENABLE): a single-beat QoS 0 PUBLISH whose topic is
// printable ASCII of up to FAST_TOPIC bytes and FAST_LEVELS levels is taken whole in one
// cycle and issued through a pipeline, so such PUBLISHes come in one a cycle (the paper's
// rate, 6.2) where the byte checks take ceil(bytes / LANES) cycles each; the descriptor
// beats are the ones the byte checks would issue. Everything else takes the byte checks.
// Packets leave in arrival order: the two paths never hold packets at the same time.
//
// Topic names are never stored: each name is carried as its two CRC-32 hashes (the Topic
// Table's and the Subscriber Table's seeds, tables.py) and its length. The rewriter snapshots
// the hashes at every '/' of a PUBLISH topic (the CRC runs through the lanes, so a beat's
// '/'s are all seen in its cycles) and hashes the `#` on issue, so `a/b/c` is issued as
// `a/b/c`, `a/b/#`, `a/#` (tables.rewritten_names order), one name per cycle.
//
// Hardware limits (the packet is dropped and counted in `dropped_limit`): more than
// MAX_NAMES-1 levels separators in a PUBLISH topic, more than MAX_NAMES filters in one
// SUBSCRIBE/UNSUBSCRIBE, a PUBLISH of more beats than the message queue has entries, a
// topic + message over 65,535 bytes (the jobs' length field; no UDP datagram is that long).
`default_nettype none
module mqtt_parser #(
    parameter W = 128,           // bytes per beat
    parameter LANES = 16,        // bytes checked per cycle (divides W)
    parameter MAX_NAMES = 16,
    parameter QAW = 10,
    parameter FAST_ENABLE = 1,   // the fast path for single-beat QoS 0 PUBLISHes (below)
    parameter FAST_TOPIC = 28,   // ... topics of up to this many bytes (the paper's 256 bits)
    parameter FAST_LEVELS = 4    // ... and levels (at least 2; at most MAX_NAMES are taken)
) (
    input  wire           clk,
    input  wire           rst,
    input  wire [8*W-1:0] s_tdata,
    input  wire [W-1:0]   s_tkeep,
    input  wire           s_tvalid,
    output wire           s_tready,
    input  wire           s_tlast,
    input  wire [47:0]    s_tuser,
    // message queue, write side (one entry per beat)
    output wire           q_wr_en,
    output wire [8*W-1:0] q_wr_data,
    output wire           q_commit,
    output wire           q_abort,
    input  wire           q_full,
    input  wire           q_others,
    // descriptors to the lookup engine
    output wire [187:0]   d_tdata,     // DESC_W (mqtt_defs.vh)
    output wire           d_tvalid,
    input  wire           d_tready,
    output wire           d_tlast,
    output reg  [31:0]    dropped_malformed,
    output reg  [31:0]    dropped_limit,
    output wire           busy
);
    `include "mqtt_defs.vh"

    localparam P_FIRST = 2'd0, P_RL = 2'd1, P_BODY = 2'd2, P_EMIT = 2'd3;
    localparam NW = $clog2(MAX_NAMES + 1);
    localparam CHUNKS = W / LANES;
    localparam CW = CHUNKS > 1 ? $clog2(CHUNKS) : 1;

    // ---- the packet's state: registers ----------------------------------
    reg [1:0]  phase;
    reg [4:0]  fs;
    reg [3:0]  ptype, pflags;
    reg [27:0] rl_value;
    reg [1:0]  rl_count;
    reg [27:0] rem;
    reg        bad, limit;
    reg [47:0] src;
    reg [15:0] pid;
    // current string field
    reg [15:0] slen, spos;
    reg [1:0]  u_need;
    reg [7:0]  u_lo, u_hi;
    reg [31:0] c0, cS;
    reg [7:0]  prev;
    reg        seen_hash, refused;
    reg [2:0]  cfield;
    reg [7:0]  cflags;
    reg        name_ok;
    reg [7:0]  code;
    // names to issue, name k at [32*k +: 32] etc.
    reg [32*MAX_NAMES-1:0] ent_c0, ent_cS;
    reg [16*MAX_NAMES-1:0] ent_len;
    reg [MAX_NAMES-1:0]    ent_ref;
    reg [NW-1:0] nent;
    reg [31:0] top_c0, top_cS;
    reg [15:0] top_len;
    reg [15:0] msg_len;      // topic + message bytes of a PUBLISH
    reg [2:0]  hdr_in;        // fixed header bytes: 1 + remaining length bytes
    reg [10:0] nbeats;                  // queue entries written for this PUBLISH
    reg [NW:0] emit_i;
    reg [CW-1:0] chunk;                 // the lanes of the beat being checked
    reg [187:0]  sd_tdata;              // the byte-wise path's descriptor beat
    reg          sd_tvalid, sd_tlast;

    // ---- the fast path (mqtt_parser_fast.v) and the order between the two --------------
    // Packets leave in arrival order: an eligible first beat goes to the fast path only
    // while the byte-wise path is idle (no packet in its lanes, nothing being issued), and
    // a packet starts in the byte-wise path only once the fast path has issued everything.
    wire       slow_idle = phase == P_FIRST && chunk == 0;
    wire       fast_eligible, fast_ready, fast_empty;
    wire [187:0] fd_tdata;
    wire       fd_tvalid, fd_tlast;
    wire       fast_sel = FAST_ENABLE && slow_idle && fast_eligible;
    // the fast path writes and commits its beat in the cycle it takes it; a full queue
    // holds the only committed entries (nothing is in the byte-wise path): it waits
    wire       fast_take = s_tvalid && fast_sel && fast_ready && !q_full;
    wire       slow_valid = s_tvalid && !fast_sel && (!slow_idle || fast_empty);
    wire       slow_ready;
    generate
        if (FAST_ENABLE) begin : fast
            localparam LEVELS = FAST_LEVELS < MAX_NAMES ? FAST_LEVELS : MAX_NAMES;
            mqtt_parser_fast #(.W(W), .FAST_TOPIC(FAST_TOPIC), .SLOTS(LEVELS - 1)) path (
                .clk(clk), .rst(rst), .s_tdata(s_tdata), .s_tkeep(s_tkeep),
                .s_tlast(s_tlast), .s_tuser(s_tuser), .eligible(fast_eligible),
                .ready(fast_ready), .take(fast_take), .empty(fast_empty),
                .d_tdata(fd_tdata), .d_tvalid(fd_tvalid), .d_tready(d_tready),
                .d_tlast(fd_tlast));
        end else begin : no_fast
            assign fast_eligible = 1'b0;
            assign fast_ready = 1'b0;
            assign fast_empty = 1'b1;
            assign fd_tdata = 188'd0;
            assign fd_tvalid = 1'b0;
            assign fd_tlast = 1'b0;
        end
    endgenerate
    assign s_tready = fast_sel ? fast_ready && !q_full :
                      slow_ready && (!slow_idle || fast_empty);
    // at most one of the two has a descriptor beat out
    assign d_tvalid = sd_tvalid || fd_tvalid;
    assign d_tdata = fd_tvalid ? fd_tdata : sd_tdata;
    assign d_tlast = fd_tvalid ? fd_tlast : sd_tlast;

    // ---- the beat: queue writes, backpressure -------------------------------------------
    wire       first_chunk = chunk == 0;
    wire       is_publish = phase == P_FIRST ? s_tdata[7:4] == 4'd3 : ptype == 4'd3;
    wire       to_queue = first_chunk && is_publish && (phase == P_FIRST || !limit);
    // Queue full: wait while earlier messages drain; if only this packet's beats fill it,
    // the message can never fit and the packet is dropped (the beat is consumed).
    wire       q_stall = to_queue && q_full && q_others;
    wire       q_overflow = slow_valid && to_queue && q_full && !q_others;
    wire       last_chunk;
    wire       in_beat = phase != P_EMIT && slow_valid && !q_stall;
    assign slow_ready = phase != P_EMIT && !q_stall && last_chunk;
    assign busy = !slow_idle || !fast_empty;
    // written in the cycle the beat's first chunk is checked, so `q_full` is never late
    wire       slow_wr_en = in_beat && to_queue && !q_full;
    assign q_wr_en = slow_wr_en || fast_take;
    assign q_wr_data = s_tdata;

    // this cycle's lanes; keep_x[LANES] is the first lane of the next chunk (0 past the beat)
    wire [8*LANES-1:0] lane_data = s_tdata[8*LANES*chunk +: 8*LANES];
    wire [LANES-1:0]   lane_keep = s_tkeep[LANES*chunk +: LANES];
    wire               next_keep;
    generate
        if (CHUNKS > 1) begin : more
            assign next_keep = chunk != CHUNKS - 1 && s_tkeep[LANES*(chunk + 1'b1)];
        end else begin : one
            assign next_keep = 1'b0;
        end
    endgenerate
    wire [LANES:0] keep_x = {next_keep, lane_keep};
    assign last_chunk = !next_keep;

    // ---- the byte checks: LANES lanes (mqtt_parser_lane.v) one after another -------------
    localparam SW = 383 + NW;
    wire [SW*(LANES + 1)-1:0] st;     // the state before lane l at [SW*l +: SW]
    assign st[0 +: SW] = {phase, fs, ptype, pflags, rl_value, rl_count, rem, bad, limit,
                          src, pid, slen, spos, u_need, u_lo, u_hi, c0, cS, prev, seen_hash,
                          refused, cfield, cflags, name_ok, code, nent, top_c0, top_cS,
                          top_len, msg_len, hdr_in, 1'b0};
    wire [LANES-1:0]    ev, ev_ref;
    wire [32*LANES-1:0] ev_c0, ev_cS;
    wire [16*LANES-1:0] ev_len;
    wire [NW*LANES-1:0] ev_slot;
    genvar gl;
    generate
        for (gl = 0; gl < LANES; gl = gl + 1) begin : lane
            mqtt_parser_lane #(.MAX_NAMES(MAX_NAMES), .NW(NW), .SW(SW)) check (
                .st_in(st[SW*gl +: SW]), .valid(keep_x[gl]), .b(lane_data[8*gl +: 8]),
                .blast(s_tlast && !keep_x[gl + 1]), .tuser(s_tuser),
                .st_out(st[SW*(gl + 1) +: SW]), .ev(ev[gl]), .ev_c0(ev_c0[32*gl +: 32]),
                .ev_cS(ev_cS[32*gl +: 32]), .ev_len(ev_len[16*gl +: 16]), .ev_ref(ev_ref[gl]));
            // the name slot lane gl writes: nent before it
            assign ev_slot[NW*gl +: NW] = st[SW*gl + 100 +: NW];
        end
    endgenerate
    wire [1:0]               phase_n;
    wire [4:0]               fs_n;
    wire [3:0]               ptype_n;
    wire [3:0]               pflags_n;
    wire [27:0]              rl_value_n;
    wire [1:0]               rl_count_n;
    wire [27:0]              rem_n;
    wire                     bad_n;
    wire                     limit_c;
    wire [47:0]              src_n;
    wire [15:0]              pid_n;
    wire [15:0]              slen_n;
    wire [15:0]              spos_n;
    wire [1:0]               u_need_n;
    wire [7:0]               u_lo_n;
    wire [7:0]               u_hi_n;
    wire [31:0]              c0_n;
    wire [31:0]              cS_n;
    wire [7:0]               prev_n;
    wire                     seen_hash_n;
    wire                     refused_n;
    wire [2:0]               cfield_n;
    wire [7:0]               cflags_n;
    wire                     name_ok_n;
    wire [7:0]               code_n;
    wire [NW-1:0]            nent_n;
    wire [31:0]              top_c0_n;
    wire [31:0]              top_cS_n;
    wire [15:0]              top_len_n;
    wire [15:0]              msg_len_n;
    wire [2:0]               hdr_in_n;
    wire                     last_ok;
    assign {phase_n, fs_n, ptype_n, pflags_n, rl_value_n, rl_count_n, rem_n, bad_n,
             limit_c, src_n, pid_n, slen_n, spos_n, u_need_n, u_lo_n, u_hi_n, c0_n, cS_n,
             prev_n, seen_hash_n, refused_n, cfield_n, cflags_n, name_ok_n, code_n,
             nent_n, top_c0_n, top_cS_n, top_len_n, msg_len_n, hdr_in_n,
             last_ok} = st[SW*LANES +: SW];
    // the names the lanes completed, into their slots (per slot, the lane that names it:
    // constant indices only, so a mux per slot and lane)
    wire [32*MAX_NAMES-1:0] ent_c0_n, ent_cS_n;
    wire [16*MAX_NAMES-1:0] ent_len_n;
    wire [MAX_NAMES-1:0]    ent_ref_n;
    genvar gk;
    generate
        for (gk = 0; gk < MAX_NAMES; gk = gk + 1) begin : slot
            reg [80:0] name;
            integer    m;
            always @(*) begin
                name = {ent_c0[32*gk +: 32], ent_cS[32*gk +: 32], ent_len[16*gk +: 16],
                        ent_ref[gk]};
                for (m = 0; m < LANES; m = m + 1)
                    if (ev[m] && ev_slot[NW*m +: NW] == gk)
                        name = {ev_c0[32*m +: 32], ev_cS[32*m +: 32], ev_len[16*m +: 16],
                                ev_ref[m]};
            end
            assign {ent_c0_n[32*gk +: 32], ent_cS_n[32*gk +: 32], ent_len_n[16*gk +: 16],
                    ent_ref_n[gk]} = name;
        end
    endgenerate
    wire limit_n = limit_c || q_overflow;     // larger than the whole queue
    wire ended = s_tlast && last_chunk;       // the chunk with the datagram's last byte

    // The packet's last chunk: commit a PUBLISH's entries, or take back a dropped packet's,
    // in this cycle (the next packet's first beat may be written in the next)
    wire end_now = in_beat && ended;
    wire end_malformed = bad_n || !last_ok;
    wire end_limit = !end_malformed && limit_n;
    assign q_abort = end_now && (end_malformed || end_limit);
    assign q_commit = end_now && !end_malformed && !end_limit && ptype_n == 4'd3 ||
                      fast_take;

    always @(posedge clk) begin
        if (rst) begin
            phase <= P_FIRST;
            chunk <= 0;
            sd_tvalid <= 1'b0;
            sd_tlast <= 1'b0;
            dropped_malformed <= 0;
            dropped_limit <= 0;
            nent <= 0;
        end else if (phase == P_EMIT) begin
            if (!sd_tvalid || d_tready) begin
                if (sd_tvalid && sd_tlast) begin
                    sd_tvalid <= 1'b0;
                    sd_tlast <= 1'b0;
                    phase <= P_FIRST;
                end else begin
                    // beat emit_i: the packet's header and its name emit_i (mqtt_defs.vh)
                    sd_tvalid <= 1'b1;
                    sd_tlast <= ptype == 4'd3 ? emit_i == {1'b0, nent} :
                               ptype == 4'd8 || ptype == 4'd10 ? emit_i + 1'b1 == {1'b0, nent} :
                               1'b1;
                    // a PUBLISH's packet id is not needed further on: its place carries
                    // where the message lies in its queue entries (packet_gen.v)
                    sd_tdata[DESC_W-1:NAME_W] <= {
                        ptype == 4'd1 ? OP_CONNECT : ptype == 4'd3 ? OP_PUBLISH :
                        ptype == 4'd8 ? OP_SUBSCRIBE : ptype == 4'd10 ? OP_UNSUBSCRIBE :
                        ptype == 4'd12 ? OP_PINGREQ : OP_DISCONNECT,
                        ptype == 4'd3 ? {hdr_in, pflags[2:1] != 2'd0, nbeats, 1'b0} : pid,
                        src, code, msg_len, top_len};
                    if (ptype == 4'd3) begin
                        // the rewriter: the topic itself, then `prefix/#` longest first
                        if (emit_i == 0)
                            sd_tdata[NAME_W-1:0] <= {top_c0, top_cS, top_len, 1'b0};
                        else
                            sd_tdata[NAME_W-1:0] <= {
                                crc32_byte(ent_c0[32*(nent - emit_i) +: 32], "#"),
                                crc32_byte(ent_cS[32*(nent - emit_i) +: 32], "#"),
                                ent_len[16*(nent - emit_i) +: 16], 1'b0};
                    end else if (ptype == 4'd8 || ptype == 4'd10) begin
                        sd_tdata[NAME_W-1:0] <= {ent_c0[32*emit_i +: 32], ent_cS[32*emit_i +: 32],
                                                ent_len[16*emit_i +: 16], ent_ref[emit_i]};
                    end else
                        sd_tdata[NAME_W-1:0] <= {NAME_W{1'b0}};
                    emit_i <= emit_i + 1'b1;
                end
            end
        end else if (in_beat) begin
            chunk <= last_chunk ? {CW{1'b0}} : chunk + 1'b1;
            phase <= phase_n; fs <= fs_n; ptype <= ptype_n; pflags <= pflags_n;
            rl_value <= rl_value_n; rl_count <= rl_count_n; rem <= rem_n; bad <= bad_n;
            limit <= limit_n; src <= src_n; pid <= pid_n; slen <= slen_n; spos <= spos_n;
            u_need <= u_need_n; u_lo <= u_lo_n; u_hi <= u_hi_n; c0 <= c0_n; cS <= cS_n;
            prev <= prev_n; seen_hash <= seen_hash_n; refused <= refused_n;
            cfield <= cfield_n; cflags <= cflags_n; name_ok <= name_ok_n; code <= code_n;
            ent_c0 <= ent_c0_n; ent_cS <= ent_cS_n; ent_len <= ent_len_n;
            ent_ref <= ent_ref_n; nent <= nent_n; top_c0 <= top_c0_n; top_cS <= top_cS_n;
            top_len <= top_len_n; msg_len <= msg_len_n; hdr_in <= hdr_in_n;
            if (first_chunk)
                nbeats <= (phase == P_FIRST ? 11'd0 : nbeats) + {10'd0, slow_wr_en};
            if (ended) begin
                if (end_malformed) begin
                    dropped_malformed <= dropped_malformed + 1'b1;
                    phase <= P_FIRST;
                end else if (end_limit) begin
                    dropped_limit <= dropped_limit + 1'b1;
                    phase <= P_FIRST;
                end else if (ptype_n == 4'd1 || ptype_n == 4'd3 || ptype_n == 4'd8 ||
                             ptype_n == 4'd10 || ptype_n == 4'd12 || ptype_n == 4'd14) begin
                    emit_i <= 0;
                    phase <= P_EMIT;
                end else
                    phase <= P_FIRST;   // a packet a broker never receives: no answer
            end
        end
    end
endmodule
`default_nettype wire

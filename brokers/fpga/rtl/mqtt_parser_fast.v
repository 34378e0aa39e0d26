// MQTT parser fast path (seed 000, 5.3; the rate of 6.2: "one PUBLISH or SUBSCRIBE per
// cycle"): takes one single-beat QoS 0 PUBLISH per cycle, back to back, beside the byte-wise
// checks of mqtt_parser.v, which take a 76-byte PUBLISH in 5 cycles (16 lanes) and would
// cost ~113,000 LUTs checking all 128 lanes.
//
// It takes only what needs no full check, decided combinationally on the first beat
// (`eligible`): the datagram is this one beat; byte 0 is 0x30 (PUBLISH, QoS 0, no DUP, no
// RETAIN: the paper's QoS 0); byte 1, the remaining length, is one byte and equals the
// datagram's length (tkeep: its low lanes are the ones in use) minus 2; the topic length
// (bytes 2-3) is 1..FAST_TOPIC and the topic lies within the datagram; every topic byte is
// printable ASCII 0x20..0x7E other than '+' and '#' (so valid UTF-8 without U+0000, as
// core/mqtt_codec.py decode() requires); at most SLOTS '/'. Such a packet is well formed
// (decode() accepts it, whatever its message), so the fast path never drops; everything
// else goes to the byte-wise checks, which keep the drop counters.
//
// Pipeline: the arrival cycle only decides and captures the topic (the parser writes and
// commits the beat to the message queue in that cycle); then STAGES stages of STAGE_BYTES
// topic bytes each run both CRC-32s (tables.py's seeds) and shift the hashes after each
// '/' into the name slots, newest first, so slot 0 holds the longest `prefix/`; the emitter
// issues the descriptor beats {header, name} (mqtt_defs.vh) exactly as the byte-wise path
// would: the topic, then each `prefix/#` longest first (`#` hashed on issue), one a cycle,
// tlast on the last, holding the pipeline while they go out. A one-level topic is one
// descriptor beat, so one PUBLISH a cycle; its first descriptor beat leaves STAGES + 1
// cycles after its beat came in.
`default_nettype none
module mqtt_parser_fast #(
    parameter W = 128,             // bytes per beat
    parameter FAST_TOPIC = 28,     // longest topic taken (bytes; 4 + FAST_TOPIC <= W)
    parameter SLOTS = 3,           // most '/' in a topic taken (levels - 1; at least 1)
    parameter STAGE_BYTES = 16     // topic bytes hashed per pipeline stage
) (
    input  wire           clk,
    input  wire           rst,
    // the beat on the parser's input (its first beat, when the byte-wise path is idle)
    input  wire [8*W-1:0] s_tdata,
    input  wire [W-1:0]   s_tkeep,
    input  wire           s_tlast,
    input  wire [47:0]    s_tuser,
    output wire           eligible,    // the beat is a packet the fast path may take
    output wire           ready,       // the pipeline has room for it this cycle
    input  wire           take,        // it takes it (the parser: valid, ready, order, queue)
    output wire           empty,       // nothing in the pipeline or the emitter
    // descriptors to the lookup engine (the parser muxes them with the byte-wise path's)
    output reg  [187:0]   d_tdata,     // DESC_W
    output reg            d_tvalid,
    input  wire           d_tready,
    output reg            d_tlast
);
    `include "mqtt_defs.vh"

    localparam STAGES = (FAST_TOPIC + STAGE_BYTES - 1) / STAGE_BYTES;
    localparam TB = 8 * FAST_TOPIC;
    localparam TLW = $clog2(FAST_TOPIC + 1);
    localparam SLW = 80 * SLOTS;               // a slot: {crc0, crcS, len} of a `prefix/`

    // ---- the arrival: eligibility, decided on the beat ---------------------------------
    wire [7:0]  b0 = s_tdata[7:0];
    wire [7:0]  b1 = s_tdata[15:8];
    wire [15:0] tlen = {s_tdata[23:16], s_tdata[31:24]};
    wire [TB-1:0] topic = s_tdata[32 +: TB];
    // the datagram is b1 + 2 bytes: lane b1 + 1 in use, lane b1 + 2 not (past the beat: 0)
    wire [W+1:0] keep_x = {2'b00, s_tkeep};
    wire len_ok = !b1[7] && keep_x[b1 + 8'd1] && !keep_x[b1 + 8'd2];
    // 4 + topic <= b1 + 2
    wire tlen_ok = tlen != 16'd0 && tlen <= FAST_TOPIC && tlen + 16'd2 <= {8'd0, b1};
    wire [FAST_TOPIC-1:0] in_topic = ~({FAST_TOPIC{1'b1}} << tlen[TLW-1:0]);
    // per topic byte: printable ASCII but '+', '#'; the '/' count as a thermometer
    // (more[k]: more than k so far), plain logic so synthesis may balance it
    wire [FAST_TOPIC-1:0] byte_ok;
    wire [(SLOTS+1)*(FAST_TOPIC+1)-1:0] more /* verilator split_var */;
    assign more[SLOTS:0] = {(SLOTS + 1){1'b0}};
    genvar gj;
    generate
        for (gj = 0; gj < FAST_TOPIC; gj = gj + 1) begin : topic_byte
            wire [7:0] c = topic[8*gj +: 8];
            wire slash = in_topic[gj] && c == "/";
            wire [SLOTS:0] so_far = more[(SLOTS+1)*gj +: SLOTS+1];
            assign byte_ok[gj] = !in_topic[gj] ||
                                 (!c[7] && c[6:5] != 2'b00 && c != 8'h7F && c != "+" &&
                                  c != "#");
            assign more[(SLOTS+1)*(gj+1) +: SLOTS+1] =
                so_far | ({(SLOTS + 1){slash}} & {so_far[SLOTS-1:0], 1'b1});
        end
    endgenerate
    wire [SLOTS:0] slashes = more[(SLOTS+1)*FAST_TOPIC +: SLOTS+1];
    assign eligible = s_tlast && b0 == 8'h30 && len_ok && tlen_ok && &byte_ok &&
                      !slashes[SLOTS];

    // ---- the stages: stage s holds a packet before its topic bytes s*STAGE_BYTES.. ----
    // o_*: stage s's registers with its bytes hashed (what stage s + 1 or the emitter takes)
    wire [STAGES-1:0]     o_v;
    wire [48*STAGES-1:0]  o_src;
    wire [7*STAGES-1:0]   o_mlen;              // topic + message bytes: b1 - 2 <= 124
    wire [TLW*STAGES-1:0] o_tlen;
    wire [TB*STAGES-1:0]  o_topic;
    wire [FAST_TOPIC*STAGES-1:0] o_in;
    wire [SLOTS*STAGES-1:0] o_names;           // thermometer: '/'s (k + 1 or more at k)
    wire [32*STAGES-1:0]  o_c0, o_cS;
    wire [SLW*STAGES-1:0] o_slots;
    // stage s may load its registers (rdy[STAGES]: the emitter may take a packet)
    wire [STAGES:0]       rdy /* verilator split_var */;
    assign ready = rdy[0];

    genvar gs, gk;
    generate
        for (gs = 0; gs < STAGES; gs = gs + 1) begin : stage
            localparam LO = gs * STAGE_BYTES;
            localparam NB = FAST_TOPIC - LO < STAGE_BYTES ? FAST_TOPIC - LO : STAGE_BYTES;
            reg                  v;
            reg [47:0]           src;
            reg [6:0]            mlen;
            reg [TLW-1:0]        tlen_r;
            reg [TB-1:0]         topic_r;
            reg [FAST_TOPIC-1:0] in_r;
            reg [SLOTS-1:0]      names;
            reg [31:0]           c0, cS;
            reg [SLW-1:0]        slots;
            assign rdy[gs] = !v || rdy[gs + 1];
            if (gs == 0) begin : take_beat
                always @(posedge clk) begin
                    if (rst)
                        v <= 1'b0;
                    else if (rdy[0]) begin
                        v <= take;
                        src <= s_tuser;
                        mlen <= b1[6:0] - 7'd2;
                        tlen_r <= tlen[TLW-1:0];
                        topic_r <= topic;
                        in_r <= in_topic;
                        names <= slashes[SLOTS-1:0];
                        c0 <= TOPIC_SEED;
                        cS <= SUBSCRIBER_SEED;
                        slots <= {SLW{1'b0}};
                    end
                end
            end else begin : from_stage
                always @(posedge clk) begin
                    if (rst)
                        v <= 1'b0;
                    else if (rdy[gs]) begin
                        v <= o_v[gs - 1];
                        src <= o_src[48*(gs-1) +: 48];
                        mlen <= o_mlen[7*(gs-1) +: 7];
                        tlen_r <= o_tlen[TLW*(gs-1) +: TLW];
                        topic_r <= o_topic[TB*(gs-1) +: TB];
                        in_r <= o_in[FAST_TOPIC*(gs-1) +: FAST_TOPIC];
                        names <= o_names[SLOTS*(gs-1) +: SLOTS];
                        c0 <= o_c0[32*(gs-1) +: 32];
                        cS <= o_cS[32*(gs-1) +: 32];
                        slots <= o_slots[SLW*(gs-1) +: SLW];
                    end
                end
            end
            // this stage's bytes, one after another: hash, and at a '/' shift the hashes of
            // `prefix/` into slot 0 (length: the '/' is topic byte j, so j + 2 with the '#')
            wire [32*(NB+1)-1:0]  x0 /* verilator split_var */;
            wire [32*(NB+1)-1:0]  xS /* verilator split_var */;
            wire [SLW*(NB+1)-1:0] sl /* verilator split_var */;
            assign x0[31:0] = c0;
            assign xS[31:0] = cS;
            assign sl[SLW-1:0] = slots;
            for (gk = 0; gk < NB; gk = gk + 1) begin : hash_byte
                localparam [15:0] NAME_LEN = LO + gk + 2;
                wire [7:0]  c = topic_r[8*(LO+gk) +: 8];
                wire        on = in_r[LO + gk];
                wire [31:0] n0 = crc32_byte(x0[32*gk +: 32], c);
                wire [31:0] nS = crc32_byte(xS[32*gk +: 32], c);
                wire [SLW+79:0] shifted = {sl[SLW*gk +: SLW], n0, nS, NAME_LEN};
                assign x0[32*(gk+1) +: 32] = on ? n0 : x0[32*gk +: 32];
                assign xS[32*(gk+1) +: 32] = on ? nS : xS[32*gk +: 32];
                assign sl[SLW*(gk+1) +: SLW] = on && c == "/" ? shifted[SLW-1:0] :
                                                                 sl[SLW*gk +: SLW];
            end
            assign o_v[gs] = v;
            assign o_src[48*gs +: 48] = src;
            assign o_mlen[7*gs +: 7] = mlen;
            assign o_tlen[TLW*gs +: TLW] = tlen_r;
            assign o_topic[TB*gs +: TB] = topic_r;
            assign o_in[FAST_TOPIC*gs +: FAST_TOPIC] = in_r;
            assign o_names[SLOTS*gs +: SLOTS] = names;
            assign o_c0[32*gs +: 32] = x0[32*NB +: 32];
            assign o_cS[32*gs +: 32] = xS[32*NB +: 32];
            assign o_slots[SLW*gs +: SLW] = sl[SLW*NB +: SLW];
        end
    endgenerate

    // ---- the emitter: the topic's beat, then one `prefix/#` beat a cycle ---------------
    localparam L = STAGES - 1;
    // the byte-wise path's header for this packet: its pid field carries {fixed header
    // bytes 2, no packet id, 1 queue entry, 0} (mqtt_parser.v P_EMIT)
    wire [HDR_W-1:0] hdr = {OP_PUBLISH, 3'd2, 1'b0, 11'd1, 1'b0, o_src[48*L +: 48], 8'd0,
                            9'd0, o_mlen[7*L +: 7], {(16 - TLW){1'b0}}, o_tlen[TLW*L +: TLW]};
    reg [HDR_W-1:0] e_hdr;
    reg [SLW-1:0]   e_slots;                   // the names still to issue, next in slot 0
    reg [SLOTS-1:0] e_left;                    // thermometer: how many
    wire d_free = !d_tvalid || d_tready;
    assign rdy[STAGES] = d_free && !e_left[0];
    assign empty = !(|o_v) && !d_tvalid;

    always @(posedge clk) begin
        if (rst) begin
            d_tvalid <= 1'b0;
            d_tlast <= 1'b0;
            e_left <= {SLOTS{1'b0}};
        end else if (d_free) begin
            if (e_left[0]) begin
                d_tvalid <= 1'b1;
                d_tlast <= (e_left >> 1) == {SLOTS{1'b0}};
                d_tdata <= {e_hdr, crc32_byte(e_slots[79:48], "#"),
                            crc32_byte(e_slots[47:16], "#"), e_slots[15:0], 1'b0};
                e_slots <= e_slots >> 80;
                e_left <= e_left >> 1;
            end else if (o_v[L]) begin
                d_tvalid <= 1'b1;
                d_tlast <= !o_names[SLOTS*L];
                d_tdata <= {hdr, o_c0[32*L +: 32], o_cS[32*L +: 32], {(16 - TLW){1'b0}},
                            o_tlen[TLW*L +: TLW], 1'b0};
                e_hdr <= hdr;
                e_slots <= o_slots[SLW*L +: SLW];
                e_left <= o_names[SLOTS*L +: SLOTS];
            end else begin
                d_tvalid <= 1'b0;
                d_tlast <= 1'b0;
            end
        end
    end
endmodule
`default_nettype wire

// MQTT parser (seed 000, 5.3): dispatcher and `#` rewriter.
//
// Takes one UDP payload per AXI4-Stream packet, one byte per beat, the source IPv4
// address and port in tuser ({ip[31:0], port[15:0]}). The dispatcher checks the packet as
// core/mqtt_codec.py decode() does (fixed header, remaining length, fields, UTF-8 strings,
// reserved flags; a datagram that is not exactly one well-formed packet is dropped and
// counted) and writes a PUBLISH's topic name and message into the message queue as they
// arrive. Only once the last byte has been checked does it issue the packet to the lookup
// engine, as a descriptor stream: a header beat, then one beat per name to look up.
//
// Topic names are never stored: each name is carried as its two CRC-32 hashes (the Topic
// Table's and the Subscriber Table's seeds, tables.py) and its length. The rewriter snapshots
// the hashes at every '/' of a PUBLISH topic, so `a/b/c` is issued as `a/b/c`, `a/b/#`,
// `a/#` (tables.rewritten_names order), one name per cycle.
//
// Hardware limits (the packet is dropped and counted in `dropped_limit`): more than
// MAX_NAMES-1 levels separators in a PUBLISH topic, more than MAX_NAMES filters in one
// SUBSCRIBE/UNSUBSCRIBE, a topic + message longer than the message queue.
`default_nettype none
module mqtt_parser #(
    parameter MAX_NAMES = 16,
    parameter QAW = 10
) (
    input  wire         clk,
    input  wire         rst,
    input  wire [7:0]   s_tdata,
    input  wire         s_tvalid,
    output wire         s_tready,
    input  wire         s_tlast,
    input  wire [47:0]  s_tuser,
    // message queue, write side
    output wire         q_wr_en,
    output wire [7:0]   q_wr_data,
    output reg          q_commit,
    output reg          q_abort,
    input  wire         q_full,
    input  wire         q_others,
    // descriptors to the lookup engine
    output reg  [106:0] d_tdata,
    output reg          d_tvalid,
    input  wire         d_tready,
    output reg          d_tlast,
    output reg  [31:0]  dropped_malformed,
    output reg  [31:0]  dropped_limit,
    output wire         busy
);
    `include "mqtt_defs.vh"

    localparam P_FIRST = 2'd0, P_RL = 2'd1, P_BODY = 2'd2, P_EMIT = 2'd3;
    localparam F_SKIP = 5'd0, F_EMPTY = 5'd1,
               F_TLEN_H = 5'd2, F_TLEN_L = 5'd3, F_TOPIC = 5'd4, F_PID_H = 5'd5,
               F_PID_L = 5'd6, F_PAYLOAD = 5'd7,
               F_SPID_H = 5'd8, F_SPID_L = 5'd9, F_FLEN_H = 5'd10, F_FLEN_L = 5'd11,
               F_FILTER = 5'd12, F_QOS = 5'd13,
               F_SLEN_H = 5'd14, F_SLEN_L = 5'd15, F_SDATA = 5'd16, F_LEVEL = 5'd17,
               F_CFLAGS = 5'd18, F_KA_H = 5'd19, F_KA_L = 5'd20, F_CDONE = 5'd21;
    // CONNECT string/binary fields, in packet order
    localparam C_NAME = 3'd0, C_CLIENT = 3'd1, C_WTOPIC = 3'd2, C_WMSG = 3'd3,
               C_USER = 3'd4, C_PASS = 3'd5;
    localparam NW = $clog2(MAX_NAMES + 1);

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
    // names to issue
    reg [31:0] ent_c0 [0:MAX_NAMES-1];
    reg [31:0] ent_cS [0:MAX_NAMES-1];
    reg [15:0] ent_len [0:MAX_NAMES-1];
    reg        ent_ref [0:MAX_NAMES-1];
    reg [NW-1:0] nent;
    reg [31:0] top_c0, top_cS;
    reg [15:0] top_len;
    reg [15:0] msg_len;
    reg [NW:0] emit_i;

    wire body_byte_to_queue = phase == P_BODY && !bad && !limit && ptype == 4'd3 &&
                              (fs == F_TOPIC || fs == F_PAYLOAD);
    // Queue full: wait while earlier messages drain; if only this packet's bytes fill it,
    // the message can never fit and the packet is dropped (the byte is consumed).
    wire q_stall = body_byte_to_queue && q_full && q_others;
    assign s_tready = phase != P_EMIT && !q_stall;
    assign busy = phase != P_FIRST;

    wire take = s_tvalid && s_tready;
    wire [7:0] b = s_tdata;
    // written in the cycle the byte is taken, so `q_full` is never a cycle late
    assign q_wr_en = take && body_byte_to_queue && !q_full;
    assign q_wr_data = b;

    // UTF-8 (strict, as Python's decoder) and U+0000, one byte of a string
    reg        u_ok;
    reg [1:0]  u_need_n;
    reg [7:0]  u_lo_n, u_hi_n;
    always @(*) begin
        u_ok = 1'b1; u_need_n = 2'd0; u_lo_n = 8'h80; u_hi_n = 8'hBF;
        if (u_need != 0) begin
            u_ok = b >= u_lo && b <= u_hi;
            u_need_n = u_need - 2'd1;
        end else if (b == 8'h00) u_ok = 1'b0;
        else if (b < 8'h80) u_ok = 1'b1;
        else if (b >= 8'hC2 && b <= 8'hDF) u_need_n = 2'd1;
        else if (b == 8'hE0) begin u_need_n = 2'd2; u_lo_n = 8'hA0; end
        else if (b == 8'hED) begin u_need_n = 2'd2; u_hi_n = 8'h9F; end
        else if (b >= 8'hE1 && b <= 8'hEF) u_need_n = 2'd2;
        else if (b == 8'hF0) begin u_need_n = 2'd3; u_lo_n = 8'h90; end
        else if (b >= 8'hF1 && b <= 8'hF3) u_need_n = 2'd3;
        else if (b == 8'hF4) begin u_need_n = 2'd3; u_hi_n = 8'h8F; end
        else u_ok = 1'b0;
    end

    wire [31:0] c0_n = crc32_byte(c0, b);
    wire [31:0] cS_n = crc32_byte(cS, b);
    wire [15:0] len16 = {s_tdata, 8'd0};

    // What follows a finished CONNECT field
    function automatic [2:0] after_connect(input [2:0] field, input [7:0] flags);
        begin
            after_connect = 3'd7;               // 7: no more fields
            case (field)
                C_CLIENT: after_connect = flags[2] ? C_WTOPIC : flags[7] ? C_USER :
                                          flags[6] ? C_PASS : 3'd7;
                C_WTOPIC: after_connect = C_WMSG;
                C_WMSG:   after_connect = flags[7] ? C_USER : flags[6] ? C_PASS : 3'd7;
                C_USER:   after_connect = flags[6] ? C_PASS : 3'd7;
                default:  after_connect = 3'd7;
            endcase
        end
    endfunction

    // --- the byte FSM -------------------------------------------------------------------
    reg [4:0]  fs_n;
    reg        bad_n, limit_n, last_ok;
    reg [15:0] field_len;
    reg        field_done;
    integer    k;

    always @(posedge clk) begin
        q_commit <= 1'b0;
        q_abort <= 1'b0;
        if (rst) begin
            phase <= P_FIRST;
            d_tvalid <= 1'b0;
            d_tlast <= 1'b0;
            dropped_malformed <= 0;
            dropped_limit <= 0;
            nent <= 0;
        end else if (phase == P_EMIT) begin
            if (!d_tvalid || d_tready) begin
                if (d_tvalid && d_tlast) begin
                    d_tvalid <= 1'b0;
                    d_tlast <= 1'b0;
                    phase <= P_FIRST;
                end else begin
                    d_tvalid <= 1'b1;
                    d_tlast <= emit_i == {1'b0, nent} + (ptype == 4'd3 ? 1'b1 : 1'b0);
                    if (emit_i == 0) begin
                        d_tdata <= {ptype == 4'd1 ? OP_CONNECT : ptype == 4'd3 ? OP_PUBLISH :
                                    ptype == 4'd8 ? OP_SUBSCRIBE : ptype == 4'd10 ?
                                    OP_UNSUBSCRIBE : ptype == 4'd12 ? OP_PINGREQ :
                                    OP_DISCONNECT, pid, src, code, msg_len, top_len};
                    end else if (ptype == 4'd3) begin
                        // the rewriter: the topic itself, then `prefix/#` longest first
                        if (emit_i == 1)
                            d_tdata <= {26'd0, top_c0, top_cS, top_len, 1'b0};
                        else
                            d_tdata <= {26'd0, ent_c0[nent - emit_i + 1],
                                        ent_cS[nent - emit_i + 1],
                                        ent_len[nent - emit_i + 1], 1'b0};
                    end else begin
                        d_tdata <= {26'd0, ent_c0[emit_i - 1], ent_cS[emit_i - 1],
                                    ent_len[emit_i - 1], ent_ref[emit_i - 1]};
                    end
                    emit_i <= emit_i + 1'b1;
                end
            end
        end else if (take) begin
            fs_n = fs;
            bad_n = bad;
            limit_n = limit;
            last_ok = 1'b0;
            field_done = 1'b0;
            field_len = 16'd0;
            if (phase == P_FIRST) begin
                ptype <= b[7:4];
                pflags <= b[3:0];
                src <= s_tuser;
                rl_value <= 0;
                rl_count <= 0;
                nent <= 0;
                msg_len <= 0;
                pid <= 0;
                code <= 0;
                // reserved packet types, reserved fixed-header flags (2.2.1, 2.2.2)
                bad_n = b[7:4] == 4'd0 || b[7:4] == 4'd15 ||
                        (b[7:4] != 4'd3 && b[3:0] != ((b[7:4] == 4'd6 || b[7:4] == 4'd8 ||
                                                      b[7:4] == 4'd10) ? 4'd2 : 4'd0)) ||
                        (b[7:4] == 4'd3 && (b[2:1] == 2'd3 || (b[3] && b[2:1] == 2'd0))) ||
                        s_tlast;            // one byte cannot hold a fixed header
                limit_n = 1'b0;
                if (!s_tlast) phase <= P_RL;
            end else if (phase == P_RL) begin
                rl_value <= rl_value | ({21'd0, b[6:0]} << (7 * rl_count));
                rl_count <= rl_count + 1'b1;
                if (b[7] && rl_count == 2'd3) bad_n = 1'b1;          // past four bytes
                if (!b[7] || rl_count == 2'd3) begin
                    rem <= rl_value | ({21'd0, b[6:0]} << (7 * rl_count));
                    phase <= P_BODY;
                    case (ptype)
                        4'd1:  begin fs_n = F_SLEN_H; cfield <= C_NAME; end
                        4'd3:  fs_n = F_TLEN_H;
                        4'd8, 4'd10: fs_n = F_SPID_H;
                        4'd12, 4'd14: fs_n = F_EMPTY;
                        default: fs_n = F_SKIP;
                    endcase
                    // an empty body ends here: only PINGREQ and DISCONNECT may
                    last_ok = (fs_n == F_EMPTY || fs_n == F_SKIP) &&
                              (rl_value | ({21'd0, b[6:0]} << (7 * rl_count))) == 0;
                end
            end else begin  // P_BODY
                rem <= rem - 1'b1;
                if (rem == 0) bad_n = 1'b1;   // bytes beyond the remaining length
                case (fs)
                    F_SKIP: ;
                    F_EMPTY: bad_n = 1'b1;
                    // ---- PUBLISH --------------------------------------------------
                    F_TLEN_H: begin slen[15:8] <= b; fs_n = F_TLEN_L; end
                    F_TLEN_L: begin
                        slen[7:0] <= b; spos <= 0; u_need <= 0; c0 <= TOPIC_SEED;
                        cS <= SUBSCRIBER_SEED;
                        if ({slen[15:8], b} == 16'd0) bad_n = 1'b1;  // empty topic (4.7.3)
                        fs_n = F_TOPIC;
                    end
                    F_TOPIC: begin
                        if (!u_ok || b == "+" || b == "#") bad_n = 1'b1;
                        u_need <= u_need_n; u_lo <= u_lo_n; u_hi <= u_hi_n;
                        c0 <= c0_n; cS <= cS_n;
                        spos <= spos + 1'b1;
                        if (b == "/") begin
                            if (nent == MAX_NAMES - 1) limit_n = 1'b1;
                            else begin
                                ent_c0[nent] <= crc32_byte(c0_n, "#");
                                ent_cS[nent] <= crc32_byte(cS_n, "#");
                                ent_len[nent] <= spos + 16'd2;
                                nent <= nent + 1'b1;
                            end
                        end
                        if (spos + 1'b1 == slen) begin
                            if (u_need_n != 0) bad_n = 1'b1;
                            top_c0 <= c0_n; top_cS <= cS_n; top_len <= slen;
                            fs_n = pflags[2:1] != 0 ? F_PID_H : F_PAYLOAD;
                        end
                    end
                    F_PID_H: begin pid[15:8] <= b; fs_n = F_PID_L; end
                    F_PID_L: begin
                        pid[7:0] <= b;
                        if ({pid[15:8], b} == 16'd0) bad_n = 1'b1;
                        fs_n = F_PAYLOAD;
                    end
                    F_PAYLOAD: ;
                    // ---- SUBSCRIBE / UNSUBSCRIBE -----------------------------------
                    F_SPID_H: begin pid[15:8] <= b; fs_n = F_SPID_L; end
                    F_SPID_L: begin
                        pid[7:0] <= b;
                        if ({pid[15:8], b} == 16'd0) bad_n = 1'b1;
                        fs_n = F_FLEN_H;
                    end
                    F_FLEN_H: begin slen[15:8] <= b; fs_n = F_FLEN_L; end
                    F_FLEN_L: begin
                        slen[7:0] <= b; spos <= 0; u_need <= 0; c0 <= TOPIC_SEED;
                        cS <= SUBSCRIBER_SEED; seen_hash <= 1'b0; refused <= 1'b0;
                        if ({slen[15:8], b} == 16'd0) begin   // empty filter: refused
                            if (nent == MAX_NAMES) limit_n = 1'b1;
                            else begin
                                ent_c0[nent] <= TOPIC_SEED; ent_cS[nent] <= SUBSCRIBER_SEED;
                                ent_len[nent] <= 0; ent_ref[nent] <= 1'b1;
                                nent <= nent + 1'b1;
                            end
                            fs_n = ptype == 4'd8 ? F_QOS : F_FLEN_H;
                        end else
                            fs_n = F_FILTER;
                    end
                    F_FILTER: begin
                        if (!u_ok) bad_n = 1'b1;
                        u_need <= u_need_n; u_lo <= u_lo_n; u_hi <= u_hi_n;
                        c0 <= c0_n; cS <= cS_n;
                        spos <= spos + 1'b1;
                        prev <= b;
                        // tables.filter_refusal: '+', '#' not last or not after '/'
                        if (b == "#") seen_hash <= 1'b1;
                        if (b == "+" || seen_hash || (b == "#" && (spos == 0 || prev != "/")))
                            refused <= 1'b1;
                        if (spos + 1'b1 == slen) begin
                            if (u_need_n != 0) bad_n = 1'b1;
                            if (nent == MAX_NAMES) limit_n = 1'b1;
                            else begin
                                ent_c0[nent] <= c0_n; ent_cS[nent] <= cS_n;
                                ent_len[nent] <= slen;
                                ent_ref[nent] <= refused || b == "+" || seen_hash ||
                                                 (b == "#" && (spos == 0 || prev != "/"));
                                nent <= nent + 1'b1;
                            end
                            fs_n = ptype == 4'd8 ? F_QOS : F_FLEN_H;
                        end
                    end
                    F_QOS: begin
                        if (b > 8'd2) bad_n = 1'b1;
                        fs_n = F_FLEN_H;
                    end
                    // ---- CONNECT ---------------------------------------------------
                    F_SLEN_H: begin slen[15:8] <= b; fs_n = F_SLEN_L; end
                    F_SLEN_L: begin
                        slen[7:0] <= b; spos <= 0; u_need <= 0;
                        if (cfield == C_NAME) name_ok <= {slen[15:8], b} == 16'd4;
                        if ({slen[15:8], b} == 16'd0) begin
                            field_done = 1'b1;
                        end else
                            fs_n = F_SDATA;
                    end
                    F_SDATA: begin
                        if (cfield != C_WMSG && cfield != C_PASS) begin
                            if (!u_ok) bad_n = 1'b1;
                            u_need <= u_need_n; u_lo <= u_lo_n; u_hi <= u_hi_n;
                        end
                        if (cfield == C_NAME && b != (spos == 0 ? "M" : spos == 1 ? "Q" : "T"))
                            name_ok <= 1'b0;
                        spos <= spos + 1'b1;
                        if (spos + 1'b1 == slen) begin
                            if (cfield != C_WMSG && cfield != C_PASS && u_need_n != 0)
                                bad_n = 1'b1;
                            field_done = 1'b1;
                        end
                    end
                    F_LEVEL: begin
                        code <= (b == 8'd4 && name_ok) ? 8'd0 : 8'd1;
                        fs_n = F_CFLAGS;
                    end
                    F_CFLAGS: begin
                        cflags <= b;
                        if (b[0]) bad_n = 1'b1;                          // 3.1.2.3
                        if (b[2] ? b[4:3] == 2'd3 : (b[4:3] != 0 || b[5])) bad_n = 1'b1;
                        if (b[6] && !b[7]) bad_n = 1'b1;                 // 3.1.2.9
                        fs_n = F_KA_H;
                    end
                    F_KA_H: fs_n = F_KA_L;
                    F_KA_L: begin fs_n = F_SLEN_H; cfield <= C_CLIENT; end
                    F_CDONE: bad_n = 1'b1;
                    default: bad_n = 1'b1;
                endcase
                if (field_done) begin
                    if (cfield == C_NAME)
                        fs_n = F_LEVEL;
                    else if (after_connect(cfield, cflags) == 3'd7)
                        fs_n = F_CDONE;
                    else begin
                        fs_n = F_SLEN_H;
                        cfield <= after_connect(cfield, cflags);
                    end
                end
                // a packet may end only on a field boundary where its type may end
                case (ptype)
                    4'd1:  last_ok = fs_n == F_CDONE;
                    4'd3:  last_ok = fs_n == F_PAYLOAD;
                    4'd8, 4'd10: last_ok = fs_n == F_FLEN_H &&
                                           (nent != 0 || (fs == F_FILTER || fs == F_QOS ||
                                                          fs == F_FLEN_L));
                    default: last_ok = 1'b1;
                endcase
                if (rem != 1) last_ok = 1'b0;
            end
            fs <= fs_n;
            bad <= bad_n;
            limit <= limit_n;
            // topic and message into the message queue
            if (body_byte_to_queue) begin
                if (q_full) limit_n = 1'b1;                 // larger than the whole queue
                else
                    msg_len <= msg_len + 1'b1;
                limit <= limit_n;
            end
            if (s_tlast) begin
                if (bad_n || !last_ok) begin
                    dropped_malformed <= dropped_malformed + 1'b1;
                    q_abort <= 1'b1;
                    phase <= P_FIRST;
                end else if (limit_n) begin
                    dropped_limit <= dropped_limit + 1'b1;
                    q_abort <= 1'b1;
                    phase <= P_FIRST;
                end else if (ptype == 4'd1 || ptype == 4'd3 || ptype == 4'd8 ||
                             ptype == 4'd10 || ptype == 4'd12 || ptype == 4'd14) begin
                    if (ptype == 4'd3) q_commit <= 1'b1;
                    emit_i <= 0;
                    phase <= P_EMIT;
                end else
                    phase <= P_FIRST;   // a packet a broker never receives: no answer
            end
        end
    end
endmodule
`default_nettype wire

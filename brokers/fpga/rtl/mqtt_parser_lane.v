// One byte of the MQTT parser's checks (mqtt_parser.v), combinational: the packet's state
// before the byte in, after it out (unchanged when the lane holds no byte). The parser
// chains LANES of these, one per byte lane of the part of the beat it checks in a cycle.
// State (st_in, st_out), most significant first: phase, fs, ptype, pflags, rl_value,
// rl_count, rem, bad, limit, src, pid, slen, spos, u_need, u_lo, u_hi, c0, cS, prev,
// seen_hash, refused, cfield, cflags, name_ok, code, nent, top_c0, top_cS, top_len, msg_len,
// hdr_in, last_ok (mqtt_parser.v declares them). The names are not in it: a lane reports
// the name it completes (ev_*), the parser stores it.
`default_nettype none
module mqtt_parser_lane #(
    parameter MAX_NAMES = 16,
    parameter NW = $clog2(MAX_NAMES + 1),
    parameter SW = 383 + NW
) (
    input  wire [SW-1:0] st_in,
    input  wire          valid,    // the lane holds a byte of the datagram
    input  wire [7:0]    b,
    input  wire          blast,    // ... its last byte
    input  wire [47:0]   tuser,
    output reg  [SW-1:0] st_out,
    // a name completed at this byte (a PUBLISH topic's `prefix/`, a filter): its hashes,
    // length and refusal, for name slot `nent` of st_in (the parser stores it)
    output reg           ev,
    output reg  [31:0]   ev_c0,
    output reg  [31:0]   ev_cS,
    output reg  [15:0]   ev_len,
    output reg           ev_ref
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
    reg [1:0]               phase_n;
    reg [4:0]               fs_n;
    reg [3:0]               ptype_n;
    reg [3:0]               pflags_n;
    reg [27:0]              rl_value_n;
    reg [1:0]               rl_count_n;
    reg [27:0]              rem_n;
    reg                     bad_n;
    reg                     limit_n;
    reg [47:0]              src_n;
    reg [15:0]              pid_n;
    reg [15:0]              slen_n;
    reg [15:0]              spos_n;
    reg [1:0]               u_need_n;
    reg [7:0]               u_lo_n;
    reg [7:0]               u_hi_n;
    reg [31:0]              c0_n;
    reg [31:0]              cS_n;
    reg [7:0]               prev_n;
    reg                     seen_hash_n;
    reg                     refused_n;
    reg [2:0]               cfield_n;
    reg [7:0]               cflags_n;
    reg                     name_ok_n;
    reg [7:0]               code_n;
    reg [NW-1:0]            nent_n;
    reg [31:0]              top_c0_n;
    reg [31:0]              top_cS_n;
    reg [15:0]              top_len_n;
    reg [15:0]              msg_len_n;
    reg [2:0]               hdr_in_n;
    reg                     last_ok;

    // UTF-8 (strict, as Python's decoder) and U+0000, one byte of a string:
    // {ok, need, lo, hi} after byte c given the bytes still needed and their range
    function automatic [18:0] utf8(input [1:0] need, input [7:0] lo, input [7:0] hi,
                                   input [7:0] c);
        reg ok;
        reg [1:0] n;
        reg [7:0] l, h;
        begin
            ok = 1'b1; n = 2'd0; l = 8'h80; h = 8'hBF;
            if (need != 0) begin
                ok = c >= lo && c <= hi;
                n = need - 2'd1;
            end else if (c == 8'h00) ok = 1'b0;
            else if (c < 8'h80) ok = 1'b1;
            else if (c >= 8'hC2 && c <= 8'hDF) n = 2'd1;
            else if (c == 8'hE0) begin n = 2'd2; l = 8'hA0; end
            else if (c == 8'hED) begin n = 2'd2; h = 8'h9F; end
            else if (c >= 8'hE1 && c <= 8'hEF) n = 2'd2;
            else if (c == 8'hF0) begin n = 2'd3; l = 8'h90; end
            else if (c >= 8'hF1 && c <= 8'hF3) n = 2'd3;
            else if (c == 8'hF4) begin n = 2'd3; h = 8'h8F; end
            else ok = 1'b0;
            utf8 = {ok, n, l, h};
        end
    endfunction

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

    reg        field_done, ok;
    reg [4:0]  fs_o;
    reg [27:0] rem_o, rl_t;
    reg [15:0] spos_o;
    reg [NW-1:0] nent_o;
    reg [31:0] x0, xS;
    reg [1:0]  un;
    reg [7:0]  ulo, uhi;

    always @(*) begin
        {phase_n, fs_n, ptype_n, pflags_n, rl_value_n, rl_count_n, rem_n, bad_n, limit_n,
        src_n, pid_n, slen_n, spos_n, u_need_n, u_lo_n, u_hi_n, c0_n, cS_n, prev_n,
        seen_hash_n, refused_n, cfield_n, cflags_n, name_ok_n, code_n, nent_n, top_c0_n, top_cS_n, top_len_n, msg_len_n, hdr_in_n,
        last_ok} = st_in;
        ev = 1'b0; ev_c0 = 32'd0; ev_cS = 32'd0; ev_len = 16'd0; ev_ref = 1'b0;
        field_done = 1'b0; ok = 1'b1; fs_o = 5'd0; rem_o = 28'd0; rl_t = 28'd0;
        spos_o = 16'd0; nent_o = 0; x0 = 32'd0; xS = 32'd0; un = 2'd0; ulo = 8'd0;
        uhi = 8'd0;
        if (valid) begin
            last_ok = 1'b0;
            field_done = 1'b0;
            if (phase_n == P_FIRST) begin
                ptype_n = b[7:4];
                pflags_n = b[3:0];
                src_n = tuser;
                rl_value_n = 0;
                rl_count_n = 0;
                nent_n = 0;
                msg_len_n = 0;
                top_len_n = 0;      // the header's topic length: 0 but in a PUBLISH
                pid_n = 0;
                code_n = 0;
                // reserved packet types, reserved fixed-header flags (2.2.1, 2.2.2)
                bad_n = b[7:4] == 4'd0 || b[7:4] == 4'd15 ||
                        (b[7:4] != 4'd3 && b[3:0] != ((b[7:4] == 4'd6 || b[7:4] == 4'd8 ||
                                                      b[7:4] == 4'd10) ? 4'd2 : 4'd0)) ||
                        (b[7:4] == 4'd3 && (b[2:1] == 2'd3 || (b[3] && b[2:1] == 2'd0))) ||
                        blast;              // one byte cannot hold a fixed header
                limit_n = 1'b0;
                phase_n = P_RL;
            end else if (phase_n == P_RL) begin
                rl_t = rl_value_n | ({21'd0, b[6:0]} << (7 * rl_count_n));
                if (b[7] && rl_count_n == 2'd3) bad_n = 1'b1;     // past four bytes
                if (!b[7] || rl_count_n == 2'd3) begin
                    rem_n = rl_t;
                    hdr_in_n = {1'b0, rl_count_n} + 3'd2;
                    phase_n = P_BODY;
                    case (ptype_n)
                        4'd1:  begin fs_n = F_SLEN_H; cfield_n = C_NAME; end
                        4'd3:  fs_n = F_TLEN_H;
                        4'd8, 4'd10: fs_n = F_SPID_H;
                        4'd12, 4'd14: fs_n = F_EMPTY;
                        default: fs_n = F_SKIP;
                    endcase
                    // an empty body ends here: only PINGREQ and DISCONNECT may
                    last_ok = (fs_n == F_EMPTY || fs_n == F_SKIP) && rl_t == 0;
                end
                rl_value_n = rl_t;
                rl_count_n = rl_count_n + 1'b1;
            end else begin  // P_BODY
                fs_o = fs_n;
                rem_o = rem_n;
                spos_o = spos_n;
                nent_o = nent_n;
                // topic and message bytes (they are in the queue's entries)
                if (ptype_n == 4'd3 && !bad_n && !limit_n &&
                    (fs_o == F_TOPIC || fs_o == F_PAYLOAD)) begin
                    if (&msg_len_n) limit_n = 1'b1;   // over the jobs' 16-bit length
                    else msg_len_n = msg_len_n + 1'b1;
                end
                rem_n = rem_o - 1'b1;
                if (rem_o == 0) bad_n = 1'b1;   // bytes beyond the remaining length
                {ok, un, ulo, uhi} = utf8(u_need_n, u_lo_n, u_hi_n, b);
                x0 = crc32_byte(c0_n, b);
                xS = crc32_byte(cS_n, b);
                case (fs_o)
                    F_SKIP: ;
                    F_EMPTY: bad_n = 1'b1;
                    // ---- PUBLISH ----------------------------------------------
                    F_TLEN_H: begin slen_n[15:8] = b; fs_n = F_TLEN_L; end
                    F_TLEN_L: begin
                        slen_n[7:0] = b; spos_n = 0; u_need_n = 0; c0_n = TOPIC_SEED;
                        cS_n = SUBSCRIBER_SEED;
                        if (slen_n == 16'd0) bad_n = 1'b1;  // empty topic (4.7.3)
                        fs_n = F_TOPIC;
                    end
                    F_TOPIC: begin
                        if (!ok || b == "+" || b == "#") bad_n = 1'b1;
                        u_need_n = un; u_lo_n = ulo; u_hi_n = uhi;
                        c0_n = x0; cS_n = xS;
                        spos_n = spos_o + 1'b1;
                        if (b == "/") begin
                            if (nent_o == MAX_NAMES - 1) limit_n = 1'b1;
                            else begin
                                // the hashes of `prefix/`; `#` is hashed on issue
                                ev = 1'b1; ev_c0 = x0; ev_cS = xS;
                                ev_len = spos_o + 16'd2; ev_ref = 1'b0;
                                nent_n = nent_o + 1'b1;
                            end
                        end
                        if (spos_o + 1'b1 == slen_n) begin
                            if (un != 0) bad_n = 1'b1;
                            top_c0_n = x0; top_cS_n = xS; top_len_n = slen_n;
                            fs_n = pflags_n[2:1] != 0 ? F_PID_H : F_PAYLOAD;
                        end
                    end
                    F_PID_H: begin pid_n[15:8] = b; fs_n = F_PID_L; end
                    F_PID_L: begin
                        pid_n[7:0] = b;
                        if (pid_n == 16'd0) bad_n = 1'b1;
                        fs_n = F_PAYLOAD;
                    end
                    F_PAYLOAD: ;
                    // ---- SUBSCRIBE / UNSUBSCRIBE -------------------------------
                    F_SPID_H: begin pid_n[15:8] = b; fs_n = F_SPID_L; end
                    F_SPID_L: begin
                        pid_n[7:0] = b;
                        if (pid_n == 16'd0) bad_n = 1'b1;
                        fs_n = F_FLEN_H;
                    end
                    F_FLEN_H: begin slen_n[15:8] = b; fs_n = F_FLEN_L; end
                    F_FLEN_L: begin
                        slen_n[7:0] = b; spos_n = 0; u_need_n = 0; c0_n = TOPIC_SEED;
                        cS_n = SUBSCRIBER_SEED; seen_hash_n = 1'b0; refused_n = 1'b0;
                        if (slen_n == 16'd0) begin   // empty filter: refused
                            if (nent_o == MAX_NAMES) limit_n = 1'b1;
                            else begin
                                ev = 1'b1; ev_c0 = TOPIC_SEED;
                                ev_cS = SUBSCRIBER_SEED; ev_len = 16'd0; ev_ref = 1'b1;
                                nent_n = nent_o + 1'b1;
                            end
                            fs_n = ptype_n == 4'd8 ? F_QOS : F_FLEN_H;
                        end else
                            fs_n = F_FILTER;
                    end
                    F_FILTER: begin
                        if (!ok) bad_n = 1'b1;
                        u_need_n = un; u_lo_n = ulo; u_hi_n = uhi;
                        c0_n = x0; cS_n = xS;
                        spos_n = spos_o + 1'b1;
                        // tables.filter_refusal: '+', '#' not last or not after '/'
                        if (b == "+" || seen_hash_n ||
                            (b == "#" && (spos_o == 0 || prev_n != "/")))
                            refused_n = 1'b1;
                        if (b == "#") seen_hash_n = 1'b1;
                        prev_n = b;
                        if (spos_o + 1'b1 == slen_n) begin
                            if (un != 0) bad_n = 1'b1;
                            if (nent_o == MAX_NAMES) limit_n = 1'b1;
                            else begin
                                ev = 1'b1; ev_c0 = x0; ev_cS = xS; ev_len = slen_n;
                                ev_ref = refused_n;
                                nent_n = nent_o + 1'b1;
                            end
                            fs_n = ptype_n == 4'd8 ? F_QOS : F_FLEN_H;
                        end
                    end
                    F_QOS: begin
                        if (b > 8'd2) bad_n = 1'b1;
                        fs_n = F_FLEN_H;
                    end
                    // ---- CONNECT -----------------------------------------------
                    F_SLEN_H: begin slen_n[15:8] = b; fs_n = F_SLEN_L; end
                    F_SLEN_L: begin
                        slen_n[7:0] = b; spos_n = 0; u_need_n = 0;
                        if (cfield_n == C_NAME) name_ok_n = slen_n == 16'd4;
                        if (slen_n == 16'd0)
                            field_done = 1'b1;
                        else
                            fs_n = F_SDATA;
                    end
                    F_SDATA: begin
                        if (cfield_n != C_WMSG && cfield_n != C_PASS) begin
                            if (!ok) bad_n = 1'b1;
                            u_need_n = un; u_lo_n = ulo; u_hi_n = uhi;
                        end
                        if (cfield_n == C_NAME &&
                            b != (spos_o == 0 ? "M" : spos_o == 1 ? "Q" : "T"))
                            name_ok_n = 1'b0;
                        spos_n = spos_o + 1'b1;
                        if (spos_o + 1'b1 == slen_n) begin
                            if (cfield_n != C_WMSG && cfield_n != C_PASS && un != 0)
                                bad_n = 1'b1;
                            field_done = 1'b1;
                        end
                    end
                    F_LEVEL: begin
                        code_n = (b == 8'd4 && name_ok_n) ? 8'd0 : 8'd1;
                        fs_n = F_CFLAGS;
                    end
                    F_CFLAGS: begin
                        cflags_n = b;
                        if (b[0]) bad_n = 1'b1;                          // 3.1.2.3
                        if (b[2] ? b[4:3] == 2'd3 : (b[4:3] != 0 || b[5])) bad_n = 1'b1;
                        if (b[6] && !b[7]) bad_n = 1'b1;                 // 3.1.2.9
                        fs_n = F_KA_H;
                    end
                    F_KA_H: fs_n = F_KA_L;
                    F_KA_L: begin fs_n = F_SLEN_H; cfield_n = C_CLIENT; end
                    F_CDONE: bad_n = 1'b1;
                    default: bad_n = 1'b1;
                endcase
                if (field_done) begin
                    if (cfield_n == C_NAME)
                        fs_n = F_LEVEL;
                    else if (after_connect(cfield_n, cflags_n) == 3'd7)
                        fs_n = F_CDONE;
                    else begin
                        fs_n = F_SLEN_H;
                        cfield_n = after_connect(cfield_n, cflags_n);
                    end
                end
                // a packet may end only on a field boundary where its type may end
                case (ptype_n)
                    4'd1:  last_ok = fs_n == F_CDONE;
                    4'd3:  last_ok = fs_n == F_PAYLOAD;
                    4'd8, 4'd10: last_ok = fs_n == F_FLEN_H &&
                                           (nent_o != 0 || (fs_o == F_FILTER ||
                                            fs_o == F_QOS || fs_o == F_FLEN_L));
                    default: last_ok = 1'b1;
                endcase
                if (rem_o != 1) last_ok = 1'b0;
            end
        end
        st_out = {phase_n, fs_n, ptype_n, pflags_n, rl_value_n, rl_count_n, rem_n, bad_n, limit_n,
        src_n, pid_n, slen_n, spos_n, u_need_n, u_lo_n, u_hi_n, c0_n, cS_n, prev_n,
        seen_hash_n, refused_n, cfield_n, cflags_n, name_ok_n, code_n, nent_n, top_c0_n, top_cS_n, top_len_n, msg_len_n, hdr_in_n,
        last_ok};
    end
endmodule
`default_nettype wire

// MQTT packet generator (seed 000, 5.6): turns the lookup engine's jobs into MQTT packets on
// an AXI4-Stream of W bytes per beat (tkeep: the low lanes in use, every beat but a packet's
// last full), the destination {ip, port} in tuser. CONNACK, SUBACK, UNSUBACK and PINGRESP
// are one beat, made from the job's fields. A PUBLISH copy is built as
// encode_publish(topic, message) builds it (QoS 0, retain clear): 0x30, the remaining length
// (1-3 bytes), then the received packet from its topic length field on, with the packet
// identifier of a QoS 1/2 PUBLISH taken out. The received packet is read from its message
// queue entries (one beat each, as received): output lane j of beat k is byte
// k*W + j + d of the received packet, d = (its fixed header length - ours) before the
// message and 2 more after it when the identifier goes, so each output beat is cut from two
// neighbouring entries.
//
// The head message's first entry is kept once read (until the message is popped): a copy
// of a message of one entry (W = 128: a PUBLISH of up to 128 bytes) then goes out in the
// cycle its job is taken, one copy per cycle; longer messages read their entries, one per
// cycle, behind a cycle of read latency. A message is popped by its last copy's job
// (JOB_PUB_COPY_END), or by JOB_PUB_END if it has no copy, in the cycle that copy's last
// beat goes out; that cycle's read is the next message's first entry, so its first copy
// too goes out in the cycle its job is taken: back to back, one-entry messages with a copy
// each leave one per cycle.
`default_nettype none
module packet_gen #(
    parameter W = 128,           // bytes per beat, 32 or more (a SUBACK is one beat)
    parameter QAW = 10,
    parameter MAX_CODES = 16
) (
    input  wire           clk,
    input  wire           rst,
    input  wire [106:0]   j_tdata,
    input  wire           j_tvalid,
    output wire           j_tready,
    // message queue, read side
    output reg  [QAW-1:0] q_rd_offset,
    input  wire [8*W-1:0] q_rd_data,
    output wire           q_pop,
    output wire [QAW:0]   q_pop_len,
    output reg  [8*W-1:0] m_tdata,
    output reg  [W-1:0]   m_tkeep,
    output reg            m_tvalid,
    input  wire           m_tready,
    output reg            m_tlast,
    output reg  [47:0]    m_tuser,
    output wire           busy
);
    `include "mqtt_defs.vh"

    localparam G_IDLE = 2'd0, G_LOAD = 2'd1, G_OUT = 2'd2;
    localparam LW = $clog2(W);
    reg [1:0]  g;
    reg [8*MAX_CODES-1:0] codes;
    reg [4:0]  ncodes;
    reg [8*W-1:0] cur;           // the entry of the beat going out (entry k)
    reg [8*W-1:0] e0;            // the head message's first entry, once read
    reg        e0_valid;
    reg        e0_bus;           // ... or on q_rd_data: last cycle read offset 0 of the head
    reg        r_end;            // the copy going out pops its message
    reg [10:0] r_entries;
    reg [15:0] k;                // output beat
    reg [QAW-1:0] ri;            // entry k + 1, on q_rd_data in G_OUT

    wire [2:0]  jop = j_tdata[106:104];
    wire [47:0] jaddr = j_tdata[103:56];
    wire [15:0] jpid = j_tdata[55:40];
    wire [7:0]  jcode = j_tdata[39:32];
    wire [15:0] jmsg = j_tdata[31:16];
    wire [15:0] jtopic = j_tdata[15:0];
    // a PUBLISH job's pid field (mqtt_parser.v): received fixed header length, packet
    // identifier present, entries
    wire [2:0]  jhdr_in = jpid[15:13];
    wire        jhas_pid = jpid[12];
    wire [10:0] jentries = jpid[11:1];

    // ---- a PUBLISH copy's geometry, from the job ------------------------------------------
    wire [16:0] rl = {1'b0, jmsg} + 17'd2;      // topic length field + topic + message
    wire [2:0]  jhout = rl < 17'd128 ? 3'd2 : rl < 17'd16384 ? 3'd3 : 3'd4;
    wire [31:0] jhdr = {5'd0, rl[16:14],
                        rl < 17'd16384 ? 1'b0 : 1'b1, rl[13:7],
                        rl < 17'd128 ? 1'b0 : 1'b1, rl[6:0], 8'h30};
    wire [2:0]  jd1 = jhdr_in - jhout;
    wire [2:0]  jd2 = jd1 + (jhas_pid ? 3'd2 : 3'd0);
    wire [16:0] jsplit = {14'd0, jhout} + 17'd2 + {1'b0, jtopic};
    wire [16:0] jlen = {14'd0, jhout} + rl;
    wire [15:0] jbeats = 16'((jlen + W - 1) >> LW);
    // ... and registered for the beats after the first
    reg  [2:0]  r_hout, r_d1, r_d2;
    reg  [31:0] r_hdr;
    reg  [16:0] r_split, r_len;
    reg  [15:0] r_beats;

    // ---- one output beat of a PUBLISH copy: entries k and k + 1 -> beat k -----------------
    wire        at_job = g == G_IDLE;
    wire [8*W-1:0] e0_now = e0_valid ? e0 : q_rd_data;
    wire [8*W-1:0] b_cur = at_job ? e0_now : cur;
    wire [15:0] b_k = at_job ? 16'd0 : k;
    wire [2:0]  b_hout = at_job ? jhout : r_hout;
    wire [2:0]  b_d1 = at_job ? jd1 : r_d1;
    wire [2:0]  b_d2 = at_job ? jd2 : r_d2;
    wire [31:0] b_hdr = at_job ? jhdr : r_hdr;
    wire [16:0] b_split = at_job ? jsplit : r_split;
    wire [16:0] b_len = at_job ? jlen : r_len;
    wire [15:0] b_beats = at_job ? jbeats : r_beats;
    wire [31:0] kw = {16'd0, b_k} << LW;
    // lanes below `n` bytes from the beat's start
    function automatic [W-1:0] below(input [31:0] n_abs, input [31:0] base);
        begin
            if (n_abs <= base) below = {W{1'b0}};
            else if (n_abs - base >= W) below = {W{1'b1}};
            else below = ~({W{1'b1}} << (n_abs - base));
        end
    endfunction
    wire [W-1:0]     in_topic = below({15'd0, b_split}, kw);
    wire [W-1:0]     b_keep = below({15'd0, b_len}, kw);
    wire [16*W-1:0]  window = {q_rd_data, b_cur};
    wire [16*W-1:0]  s1 = window >> {b_d1, 3'b000};
    wire [16*W-1:0]  s2 = window >> {b_d2, 3'b000};
    // lane by lane (a generate loop: Verilator unrolls no procedural loop this long and
    // would shift the whole window for each lane's dynamic select)
    wire [8*W-1:0]   b_cut;
    genvar gj;
    generate
        for (gj = 0; gj < W; gj = gj + 1) begin : lane
            assign b_cut[8*gj +: 8] = in_topic[gj] ? s1[8*gj +: 8] : s2[8*gj +: 8];
        end
    endgenerate
    reg  [8*W-1:0]   b_data;
    always @(*) begin                         // beat 0: our fixed header, 2 to 4 bytes
        b_data = b_cut;
        if (b_k == 0) begin
            b_data[15:0] = b_hdr[15:0];
            if (b_hout >= 3'd3) b_data[23:16] = b_hdr[23:16];
            if (b_hout == 3'd4) b_data[31:24] = b_hdr[31:24];
        end
    end
    wire b_last = b_k + 16'd1 == b_beats;

    // ---- the other packets: one beat ------------------------------------------------------
    reg [8*MAX_CODES-1:0] all_codes;
    always @(*) begin
        all_codes = codes;
        all_codes[8*ncodes[3:0] +: 8] = jcode;
    end
    reg [8*(MAX_CODES + 4)-1:0] one_beat;
    reg [5:0] one_len;
    always @(*) begin
        one_beat = 0;
        one_len = 6'd4;
        case (jop)
            JOB_CONNACK: one_beat[31:0] = {jcode, 8'h00, 8'h02, 8'h20};
            JOB_PINGRESP: begin one_beat[15:0] = {8'h00, 8'hD0}; one_len = 6'd2; end
            JOB_UNSUBACK: one_beat[31:0] = {jpid[7:0], jpid[15:8], 8'h02, 8'hB0};
            default: begin  // JOB_SUBACK_END: the codes so far and this one
                one_beat = {all_codes, jpid[7:0], jpid[15:8], {3'd0, ncodes} + 8'd3, 8'h90};
                one_len = {1'b0, ncodes} + 6'd5;
            end
        endcase
    end

    wire out_free = !m_tvalid || m_tready;
    // a new job only once the last packet's last beat is taken: tuser belongs to it
    assign j_tready = g == G_IDLE && out_free;
    assign busy = g != G_IDLE || m_tvalid;
    wire take = j_tvalid && j_tready;
    wire emit = g == G_OUT && out_free;
    wire is_copy = jop == JOB_PUB_COPY || jop == JOB_PUB_COPY_END;
    wire have_e0 = e0_valid || e0_bus;
    // the job's copy goes out in the cycle it is taken (one entry, first entry at hand)
    wire copy_now = take && is_copy && have_e0 && jentries == 11'd1;

    // popped now: PUB_END, a one-cycle last copy, or a longer last copy's last beat
    assign q_pop = (take && (jop == JOB_PUB_END || (copy_now && jop == JOB_PUB_COPY_END))) ||
                   (emit && b_last && r_end);
    assign q_pop_len = g == G_OUT ? r_entries[QAW:0] : jentries[QAW:0];

    always @(*) begin
        q_rd_offset = 0;
        case (g)
            G_IDLE: q_rd_offset = q_pop ? q_pop_len[QAW-1:0] :
                                  take && is_copy && have_e0 && !copy_now ? 1 :
                                  e0_valid ? 1 : 0;
            G_LOAD: q_rd_offset = 1;
            G_OUT: q_rd_offset = q_pop ? q_pop_len[QAW-1:0] : emit ? ri + 1'b1 : ri;
            default: ;
        endcase
    end

    always @(posedge clk) begin
        if (m_tvalid && m_tready) m_tvalid <= 1'b0;
        // the head's entry 0 is on the bus next cycle: read at offset 0 with no pop, or at
        // the popped length (the next message's first entry)
        e0_bus <= q_pop || q_rd_offset == 0;
        if (rst) begin
            g <= G_IDLE;
            m_tvalid <= 1'b0;
            ncodes <= 0;
            e0_valid <= 1'b0;
            e0_bus <= 1'b0;
        end else case (g)
            G_IDLE: if (take) begin
                m_tuser <= jaddr;
                r_hout <= jhout; r_d1 <= jd1; r_d2 <= jd2; r_hdr <= jhdr;
                r_split <= jsplit; r_len <= jlen; r_beats <= jbeats;
                r_end <= jop == JOB_PUB_COPY_END;
                r_entries <= jentries;
                k <= 0;
                ri <= 1;
                case (jop)
                    JOB_PUB_COPY, JOB_PUB_COPY_END: begin
                        if (!have_e0)
                            g <= G_LOAD;              // entry 0 is read now
                        else if (copy_now) begin
                            // the whole copy is in the first entry: out now
                            m_tvalid <= 1'b1;
                            m_tdata <= b_data;
                            m_tkeep <= b_keep;
                            m_tlast <= 1'b1;
                            e0 <= e0_now;
                            e0_valid <= jop == JOB_PUB_COPY;
                        end else begin
                            cur <= e0_now;            // entry 1 is read now
                            e0 <= e0_now;
                            e0_valid <= 1'b1;
                            g <= G_OUT;
                        end
                    end
                    JOB_PUB_END: e0_valid <= 1'b0;
                    JOB_SUBACK_CODE: begin
                        codes[8*ncodes[3:0] +: 8] <= jcode;
                        ncodes <= ncodes + 1'b1;
                    end
                    default: begin    // CONNACK, PINGRESP, UNSUBACK, SUBACK_END
                        if (jop == JOB_SUBACK_END) ncodes <= 0;
                        m_tvalid <= 1'b1;
                        m_tdata <= {{(8*W - 8*(MAX_CODES + 4)){1'b0}}, one_beat};
                        m_tkeep <= ~({W{1'b1}} << one_len);
                        m_tlast <= 1'b1;
                    end
                endcase
            end
            G_LOAD: begin                             // entry 0 on the read bus
                cur <= q_rd_data;
                e0 <= q_rd_data;
                e0_valid <= 1'b1;
                g <= G_OUT;
            end
            G_OUT: if (emit) begin                    // entry k in cur, k + 1 on the bus
                m_tvalid <= 1'b1;
                m_tdata <= b_data;
                m_tkeep <= b_keep;
                m_tlast <= b_last;
                cur <= q_rd_data;
                k <= k + 1'b1;
                ri <= ri + 1'b1;
                if (b_last) begin
                    g <= G_IDLE;
                    if (r_end) e0_valid <= 1'b0;
                end
            end
            default: g <= G_IDLE;
        endcase
    end
endmodule
`default_nettype wire

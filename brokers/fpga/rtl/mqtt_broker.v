// The FPGA MQTT broker of seed 000 (section 5): MQTT parser -> lookup engine -> packet
// generator, with the message queue beside the lookup engine, joined by AXI4-Stream.
//
// Ports are UDP payload streams: the UDP/IP stack and the 10GbE MAC stay outside (the paper
// used vendor and open IP). s_axis: one datagram per packet, W bytes per beat (datagram byte
// i in beat i / W, tdata[8*(i % W) +: 8]; tkeep: the low lanes in use, every beat but the
// last full, none empty), source {IPv4 address, UDP port} in tuser. m_axis: one datagram
// per packet, the same beat layout, destination in tuser.
// One clock (100 MHz in the paper); no clock-domain crossing, so no asynchronous FIFOs.
`default_nettype none
module mqtt_broker #(
    parameter W = 128,           // bytes per beat: 1024 bits, the paper's datapath
    parameter LANES = 16,        // bytes the parser checks per cycle (divides W)
    parameter TABLE_AW = 16,     // 65,536 words per table, as in the paper
    parameter QUEUE_AW = 10,     // message queue depth 1024
    parameter MAX_NAMES = 16
) (
    input  wire        clk,
    input  wire        rst,
    input  wire [8*W-1:0] s_axis_tdata,
    input  wire [W-1:0]   s_axis_tkeep,
    input  wire        s_axis_tvalid,
    output wire        s_axis_tready,
    input  wire        s_axis_tlast,
    input  wire [47:0] s_axis_tuser,
    output wire [8*W-1:0] m_axis_tdata,
    output wire [W-1:0]   m_axis_tkeep,
    output wire        m_axis_tvalid,
    input  wire        m_axis_tready,
    output wire        m_axis_tlast,
    output wire [47:0] m_axis_tuser,
    output wire        busy,
    output wire [31:0] dropped_malformed,
    output wire [31:0] dropped_limit
);
    wire         q_wr_en, q_commit, q_abort, q_full, q_others, q_pop;
    wire [8*W-1:0] q_wr_data, q_rd_data;
    wire [QUEUE_AW-1:0] q_rd_offset;
    wire [QUEUE_AW:0]   q_pop_len;
    wire [187:0] d_tdata;               // DESC_W
    wire [106:0] j_wr_data, j_tdata;
    wire         d_tvalid, d_tready, d_tlast, j_wr_en, j_full, j_afull, j_tvalid, j_tready;
    wire         parser_busy, engine_busy, gen_busy;

    mqtt_parser #(.W(W), .LANES(LANES), .MAX_NAMES(MAX_NAMES), .QAW(QUEUE_AW)) parser (
        .clk(clk), .rst(rst),
        .s_tdata(s_axis_tdata), .s_tkeep(s_axis_tkeep), .s_tvalid(s_axis_tvalid), .s_tready(s_axis_tready),
        .s_tlast(s_axis_tlast), .s_tuser(s_axis_tuser),
        .q_wr_en(q_wr_en), .q_wr_data(q_wr_data), .q_commit(q_commit), .q_abort(q_abort),
        .q_full(q_full), .q_others(q_others),
        .d_tdata(d_tdata), .d_tvalid(d_tvalid), .d_tready(d_tready), .d_tlast(d_tlast),
        .dropped_malformed(dropped_malformed), .dropped_limit(dropped_limit),
        .busy(parser_busy));

    msg_queue #(.DEPTH(1 << QUEUE_AW), .AW(QUEUE_AW), .DW(8 * W)) queue (
        .clk(clk), .rst(rst), .wr_en(q_wr_en), .wr_data(q_wr_data), .commit(q_commit),
        .discard(q_abort), .full(q_full), .others(q_others), .rd_offset(q_rd_offset),
        .rd_data(q_rd_data), .pop(q_pop), .pop_len(q_pop_len));

    lookup_engine #(.AW(TABLE_AW)) engine (
        .clk(clk), .rst(rst), .d_tdata(d_tdata), .d_tvalid(d_tvalid), .d_tready(d_tready),
        .d_tlast(d_tlast), .j_wr_en(j_wr_en), .j_wr_data(j_wr_data), .j_full(j_afull),
        .busy(engine_busy));

    // jobs waiting for the packet generator: the engine finds copies faster than they leave.
    // The engine's write is registered, so it stops at "one entry left" (almost_full).
    sync_fifo #(.W(107), .AW(4)) jobs (
        .clk(clk), .rst(rst), .wr_en(j_wr_en), .wr_data(j_wr_data), .full(j_full),
        .almost_full(j_afull),
        .m_tdata(j_tdata), .m_tvalid(j_tvalid), .m_tready(j_tready));

    packet_gen #(.W(W), .QAW(QUEUE_AW), .MAX_CODES(MAX_NAMES)) generator (
        .clk(clk), .rst(rst), .j_tdata(j_tdata), .j_tvalid(j_tvalid), .j_tready(j_tready),
        .q_rd_offset(q_rd_offset), .q_rd_data(q_rd_data), .q_pop(q_pop),
        .q_pop_len(q_pop_len), .m_tdata(m_axis_tdata), .m_tkeep(m_axis_tkeep), .m_tvalid(m_axis_tvalid),
        .m_tready(m_axis_tready), .m_tlast(m_axis_tlast), .m_tuser(m_axis_tuser),
        .busy(gen_busy));

    assign busy = parser_busy || engine_busy || j_tvalid || gen_busy || j_wr_en;
endmodule
`default_nettype wire

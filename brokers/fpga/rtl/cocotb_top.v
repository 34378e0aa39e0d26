// Simulation-only toplevel for the cocotb tests (tests/cocotb_*.py): the broker, a second
// message queue on its own ports (qt_*) for the queue's unit tests, and two more parsers,
// each writing its own message queue, for the parser's tests (cocotb_parser.py): pt_* with
// the fast path, ps_* without it (the byte-wise checks only), in one Verilator build. Not
// synthesized.
`default_nettype none
module cocotb_top (
    input  wire        clk,
    input  wire        rst,
    input  wire [1023:0] s_axis_tdata,
    input  wire [127:0] s_axis_tkeep,
    input  wire        s_axis_tvalid,
    output wire        s_axis_tready,
    input  wire        s_axis_tlast,
    input  wire [47:0] s_axis_tuser,
    output wire [1023:0] m_axis_tdata,
    output wire [127:0] m_axis_tkeep,
    output wire        m_axis_tvalid,
    input  wire        m_axis_tready,
    output wire        m_axis_tlast,
    output wire [47:0] m_axis_tuser,
    output wire        busy,
    output wire [31:0] dropped_malformed,
    output wire [31:0] dropped_limit,
    input  wire        qt_wr_en,
    input  wire [1023:0] qt_wr_data,
    input  wire        qt_commit,
    input  wire        qt_discard,
    output wire        qt_full,
    output wire        qt_others,
    input  wire [9:0]  qt_rd_offset,
    output wire [1023:0] qt_rd_data,
    input  wire        qt_pop,
    input  wire [10:0] qt_pop_len,
    input  wire [1023:0] pt_s_tdata,
    input  wire [127:0] pt_s_tkeep,
    input  wire        pt_s_tvalid,
    output wire        pt_s_tready,
    input  wire        pt_s_tlast,
    input  wire [47:0] pt_s_tuser,
    output wire [187:0] pt_d_tdata,
    output wire        pt_d_tvalid,
    input  wire        pt_d_tready,
    output wire        pt_d_tlast,
    output wire [31:0] pt_dropped_malformed,
    output wire [31:0] pt_dropped_limit,
    output wire        pt_busy,
    output wire        pt_q_wr_en,
    output wire        pt_q_commit,
    output wire        pt_q_abort,
    output wire        pt_q_full,
    input  wire [9:0]  pt_q_rd_offset,
    output wire [1023:0] pt_q_rd_data,
    input  wire        pt_q_pop,
    input  wire [10:0] pt_q_pop_len,
    input  wire [1023:0] ps_s_tdata,
    input  wire [127:0] ps_s_tkeep,
    input  wire        ps_s_tvalid,
    output wire        ps_s_tready,
    input  wire        ps_s_tlast,
    input  wire [47:0] ps_s_tuser,
    output wire [187:0] ps_d_tdata,
    output wire        ps_d_tvalid,
    input  wire        ps_d_tready,
    output wire        ps_d_tlast,
    output wire [31:0] ps_dropped_malformed,
    output wire [31:0] ps_dropped_limit,
    output wire        ps_busy,
    output wire        ps_q_wr_en,
    output wire        ps_q_commit,
    output wire        ps_q_abort,
    output wire        ps_q_full,
    input  wire [9:0]  ps_q_rd_offset,
    output wire [1023:0] ps_q_rd_data,
    input  wire        ps_q_pop,
    input  wire [10:0] ps_q_pop_len
);
    mqtt_broker broker (
        .clk(clk), .rst(rst), .s_axis_tdata(s_axis_tdata), .s_axis_tkeep(s_axis_tkeep), .s_axis_tvalid(s_axis_tvalid),
        .s_axis_tready(s_axis_tready), .s_axis_tlast(s_axis_tlast),
        .s_axis_tuser(s_axis_tuser), .m_axis_tdata(m_axis_tdata), .m_axis_tkeep(m_axis_tkeep),
        .m_axis_tvalid(m_axis_tvalid), .m_axis_tready(m_axis_tready),
        .m_axis_tlast(m_axis_tlast), .m_axis_tuser(m_axis_tuser), .busy(busy),
        .dropped_malformed(dropped_malformed), .dropped_limit(dropped_limit));

    msg_queue #(.DEPTH(1024), .AW(10), .DW(1024)) queue (
        .clk(clk), .rst(rst), .wr_en(qt_wr_en), .wr_data(qt_wr_data), .commit(qt_commit),
        .discard(qt_discard), .full(qt_full), .others(qt_others), .rd_offset(qt_rd_offset),
        .rd_data(qt_rd_data), .pop(qt_pop), .pop_len(qt_pop_len));

    parser_and_queue #(.FAST_ENABLE(1)) pt (
        .clk(clk), .rst(rst), .s_tdata(pt_s_tdata), .s_tkeep(pt_s_tkeep),
        .s_tvalid(pt_s_tvalid), .s_tready(pt_s_tready), .s_tlast(pt_s_tlast),
        .s_tuser(pt_s_tuser), .d_tdata(pt_d_tdata), .d_tvalid(pt_d_tvalid),
        .d_tready(pt_d_tready), .d_tlast(pt_d_tlast),
        .dropped_malformed(pt_dropped_malformed), .dropped_limit(pt_dropped_limit),
        .busy(pt_busy), .q_wr_en(pt_q_wr_en), .q_commit(pt_q_commit),
        .q_abort(pt_q_abort), .q_full(pt_q_full), .q_rd_offset(pt_q_rd_offset),
        .q_rd_data(pt_q_rd_data), .q_pop(pt_q_pop), .q_pop_len(pt_q_pop_len));
    parser_and_queue #(.FAST_ENABLE(0)) ps (
        .clk(clk), .rst(rst), .s_tdata(ps_s_tdata), .s_tkeep(ps_s_tkeep),
        .s_tvalid(ps_s_tvalid), .s_tready(ps_s_tready), .s_tlast(ps_s_tlast),
        .s_tuser(ps_s_tuser), .d_tdata(ps_d_tdata), .d_tvalid(ps_d_tvalid),
        .d_tready(ps_d_tready), .d_tlast(ps_d_tlast),
        .dropped_malformed(ps_dropped_malformed), .dropped_limit(ps_dropped_limit),
        .busy(ps_busy), .q_wr_en(ps_q_wr_en), .q_commit(ps_q_commit),
        .q_abort(ps_q_abort), .q_full(ps_q_full), .q_rd_offset(ps_q_rd_offset),
        .q_rd_data(ps_q_rd_data), .q_pop(ps_q_pop), .q_pop_len(ps_q_pop_len));
endmodule

// A parser (mqtt_parser.v, the broker's defaults but FAST_ENABLE) writing its own message
// queue (1,024 entries), both sides of the queue on ports.
module parser_and_queue #(
    parameter FAST_ENABLE = 1
) (
    input  wire        clk,
    input  wire        rst,
    input  wire [1023:0] s_tdata,
    input  wire [127:0] s_tkeep,
    input  wire        s_tvalid,
    output wire        s_tready,
    input  wire        s_tlast,
    input  wire [47:0] s_tuser,
    output wire [187:0] d_tdata,
    output wire        d_tvalid,
    input  wire        d_tready,
    output wire        d_tlast,
    output wire [31:0] dropped_malformed,
    output wire [31:0] dropped_limit,
    output wire        busy,
    output wire        q_wr_en,
    output wire        q_commit,
    output wire        q_abort,
    output wire        q_full,
    input  wire [9:0]  q_rd_offset,
    output wire [1023:0] q_rd_data,
    input  wire        q_pop,
    input  wire [10:0] q_pop_len
);
    wire [1023:0] q_wr_data;
    wire          q_others;

    mqtt_parser #(.FAST_ENABLE(FAST_ENABLE)) parser (
        .clk(clk), .rst(rst), .s_tdata(s_tdata), .s_tkeep(s_tkeep), .s_tvalid(s_tvalid),
        .s_tready(s_tready), .s_tlast(s_tlast), .s_tuser(s_tuser), .q_wr_en(q_wr_en),
        .q_wr_data(q_wr_data), .q_commit(q_commit), .q_abort(q_abort), .q_full(q_full),
        .q_others(q_others), .d_tdata(d_tdata), .d_tvalid(d_tvalid), .d_tready(d_tready),
        .d_tlast(d_tlast), .dropped_malformed(dropped_malformed),
        .dropped_limit(dropped_limit), .busy(busy));

    msg_queue #(.DEPTH(1024), .AW(10), .DW(1024)) queue (
        .clk(clk), .rst(rst), .wr_en(q_wr_en), .wr_data(q_wr_data), .commit(q_commit),
        .discard(q_abort), .full(q_full), .others(q_others), .rd_offset(q_rd_offset),
        .rd_data(q_rd_data), .pop(q_pop), .pop_len(q_pop_len));
endmodule
`default_nettype wire

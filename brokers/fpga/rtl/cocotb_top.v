// Simulation-only toplevel for the cocotb tests (tests/cocotb_*.py): the broker, and a
// second message queue on its own ports (qt_*) for the queue's unit tests, in one Verilator
// build. Not synthesized.
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
    input  wire [10:0] qt_pop_len
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
endmodule
`default_nettype wire

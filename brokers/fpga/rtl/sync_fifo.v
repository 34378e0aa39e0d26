// A small synchronous FIFO with an AXI4-Stream read side (first word falls through).
`default_nettype none
module sync_fifo #(
    parameter W = 8,
    parameter AW = 4
) (
    input  wire         clk,
    input  wire         rst,
    input  wire         wr_en,
    input  wire [W-1:0] wr_data,
    output wire         full,
    output wire         almost_full,   // one entry left
    output wire [W-1:0] m_tdata,
    output wire         m_tvalid,
    input  wire         m_tready
);
    reg [W-1:0] mem [0:(1 << AW) - 1];
    reg [AW:0] wp, rp;
    assign full = (wp - rp) == (1 << AW);
    assign almost_full = (wp - rp) >= (1 << AW) - 1;
    assign m_tvalid = wp != rp;
    assign m_tdata = mem[rp[AW-1:0]];
    always @(posedge clk) begin
        if (wr_en && !full) mem[wp[AW-1:0]] <= wr_data;
        if (rst) begin
            wp <= 0;
            rp <= 0;
        end else begin
            if (wr_en && !full) wp <= wp + 1'b1;
            if (m_tvalid && m_tready) rp <= rp + 1'b1;
        end
    end
endmodule
`default_nettype wire

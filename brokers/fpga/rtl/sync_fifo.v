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
    // the count in AW + 1 bits: `wp - rp` in a comparison with an integer would be computed
    // 32 bits wide, and read as huge once wp has wrapped and rp not yet (almost_full then
    // stalled the lookup engine a cycle: one PUBLISH in 16 a cycle late to its last copy)
    localparam [AW:0] CAP = 1 << AW;
    wire [AW:0] used = wp - rp;
    assign full = used == CAP;
    assign almost_full = used >= CAP - 1'b1;
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

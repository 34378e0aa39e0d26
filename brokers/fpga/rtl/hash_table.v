// One hash table of the lookup engine (seed 000, 5.4) in block RAM: DEPTH words of DW bits
// in 8 banks, so the 8-word probe window from any home word (tables.py: a key lives in one
// of the probe_window words from its home word, wrapping) is read in one cycle, one word
// per bank. Registered read, as block RAM: the window is on `rd_words` the cycle after
// `rd_en`, word k (slot home + k) at [k*DW +: DW]; it holds until the next read.
`default_nettype none
module hash_table #(
    parameter DW = 93,
    parameter AW = 16
) (
    input  wire            clk,
    input  wire            rd_en,
    input  wire [AW-1:0]   rd_home,
    output wire [8*DW-1:0] rd_words,
    input  wire            wr_en,
    input  wire [AW-1:0]   wr_slot,
    input  wire [DW-1:0]   wr_data
);
    localparam RW = AW - 3;
    reg [2:0] home_lo;
    reg [DW-1:0] bank_q [0:7];

    genvar g;
    generate
        for (g = 0; g < 8; g = g + 1) begin : bank
            reg [DW-1:0] mem [0:(1 << RW) - 1];
            // the window's word in this bank: home + ((g - home) mod 8)
            wire [AW-1:0] word = rd_home + {{(AW - 3){1'b0}}, 3'(g[2:0] - rd_home[2:0])};
            always @(posedge clk) begin
                if (wr_en && wr_slot[2:0] == g[2:0])
                    mem[wr_slot[AW-1:3]] <= wr_data;
                if (rd_en)
                    bank_q[g] <= mem[word[AW-1:3]];
            end
        end
    endgenerate

    always @(posedge clk)
        if (rd_en) home_lo <= rd_home[2:0];

    generate
        for (g = 0; g < 8; g = g + 1) begin : order
            assign rd_words[g*DW +: DW] = bank_q[3'(home_lo + g[2:0])];
        end
    endgenerate
endmodule
`default_nettype wire

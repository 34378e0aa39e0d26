// Message queue (seed 000, 5.5): a synchronous FIFO of DEPTH entries holding each
// PUBLISH while the lookup engine searches its destinations. An entry is one input beat of
// DW bits (W bytes: the datagram as it arrived, fixed header included; a 76-byte PUBLISH is
// one entry at W = 128), so DEPTH entries hold DEPTH beats, whatever their bytes.
//
// Write side (parser): beats are written as they arrive; `commit` makes the packet's
// entries part of the queue, `discard` takes them back (a malformed packet), each with a
// write in the same cycle (the packet's last beat) included. Read side
// (packet generator): a registered read at `rd_offset` (entries from the head message),
// replayed once per destination; `pop` frees the head message's `pop_len` entries.
`default_nettype none
module msg_queue #(
    parameter DEPTH = 1024,
    parameter AW = 10,
    parameter DW = 1024
) (
    input  wire          clk,
    input  wire          rst,
    input  wire          wr_en,
    input  wire [DW-1:0] wr_data,
    input  wire          commit,
    input  wire          discard,
    output wire          full,        // no free entry for the next write
    output wire          others,      // committed entries of earlier packets are queued
    input  wire [AW-1:0] rd_offset,
    output reg  [DW-1:0] rd_data,
    input  wire          pop,
    input  wire [AW:0]   pop_len
);
    reg [DW-1:0] mem [0:DEPTH-1];
    reg [AW:0] wr_ptr, committed, head;   // one extra bit: full and empty differ

    wire [AW:0] used = wr_ptr - head;
    assign full = used == DEPTH;
    assign others = committed != head;

    wire [AW:0] rd_ptr = head + {1'b0, rd_offset};
    always @(posedge clk) begin
        if (wr_en && !full)
            mem[wr_ptr[AW-1:0]] <= wr_data;
        rd_data <= mem[rd_ptr[AW-1:0]];
    end

    always @(posedge clk) begin
        if (rst) begin
            wr_ptr <= 0;
            committed <= 0;
            head <= 0;
        end else begin
            if (discard)
                wr_ptr <= committed;
            else if (wr_en && !full)
                wr_ptr <= wr_ptr + 1'b1;
            if (commit)
                committed <= wr_ptr + {{AW{1'b0}}, wr_en && !full};
            if (pop)
                head <= head + pop_len;
        end
    end
endmodule
`default_nettype wire

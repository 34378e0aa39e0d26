// MQTT packet generator (seed 000, 5.6): turns the lookup engine's jobs into MQTT packets,
// one byte per beat on an AXI4-Stream with the destination {ip, port} in tuser. A PUBLISH
// copy is built as encode_publish(topic, message) builds it (QoS 0, retain clear): 0x30,
// remaining length, topic length, then topic and message replayed from the message queue
// once per destination; CONNACK, SUBACK, UNSUBACK and PINGRESP from the job's fields.
`default_nettype none
module packet_gen #(
    parameter QAW = 10,
    parameter MAX_CODES = 16
) (
    input  wire           clk,
    input  wire           rst,
    input  wire [106:0]   j_tdata,
    input  wire           j_tvalid,
    output wire           j_tready,
    // message queue, read side
    output wire [QAW-1:0] q_rd_offset,
    input  wire [7:0]     q_rd_data,
    output reg            q_pop,
    output reg  [QAW:0]   q_pop_len,
    output reg  [7:0]     m_tdata,
    output reg            m_tvalid,
    input  wire           m_tready,
    output reg            m_tlast,
    output reg  [47:0]    m_tuser,
    output wire           busy
);
    `include "mqtt_defs.vh"

    localparam G_IDLE = 2'd0, G_HEAD = 2'd1, G_TAIL = 2'd2;
    localparam T_NONE = 2'd0, T_QUEUE = 2'd1, T_CODES = 2'd2;
    reg [1:0]  g;
    reg [7:0]  head [0:4];
    reg [2:0]  head_len, hi;
    reg [1:0]  tail;
    reg [15:0] tail_len, ti;
    reg [7:0]  codes [0:MAX_CODES-1];
    reg [4:0]  ncodes;

    wire [2:0]  jop = j_tdata[106:104];
    wire [47:0] jaddr = j_tdata[103:56];
    wire [15:0] jpid = j_tdata[55:40];
    wire [7:0]  jcode = j_tdata[39:32];
    wire [15:0] jmsg = j_tdata[31:16];
    wire [15:0] jtopic = j_tdata[15:0];
    wire [15:0] rl = jmsg + 16'd2;       // topic length field + topic + message

    wire out_free = !m_tvalid || m_tready;
    // a new job only once the last packet's last byte is taken: tuser belongs to it
    assign j_tready = g == G_IDLE && !q_pop && out_free;
    assign busy = g != G_IDLE || m_tvalid;
    // the queue's registered read runs one byte ahead of the output
    wire advance = g == G_TAIL && tail == T_QUEUE && out_free;
    assign q_rd_offset = advance ? ti[QAW-1:0] + 1'b1 : ti[QAW-1:0];

    always @(posedge clk) begin
        q_pop <= 1'b0;
        if (m_tvalid && m_tready) m_tvalid <= 1'b0;
        if (rst) begin
            g <= G_IDLE;
            m_tvalid <= 1'b0;
            ncodes <= 0;
        end else case (g)
            G_IDLE: if (j_tvalid && j_tready) begin
                hi <= 0;
                ti <= 0;
                tail <= T_NONE;
                tail_len <= 0;
                m_tuser <= jaddr;
                g <= G_HEAD;
                case (jop)
                    JOB_PUB_COPY: begin
                        head[0] <= 8'h30;
                        if (rl < 16'd128) begin
                            head[1] <= rl[7:0];
                            head[2] <= jtopic[15:8]; head[3] <= jtopic[7:0];
                            head_len <= 3'd4;
                        end else begin
                            head[1] <= {1'b1, rl[6:0]}; head[2] <= {1'b0, rl[13:7]};
                            head[3] <= jtopic[15:8]; head[4] <= jtopic[7:0];
                            head_len <= 3'd5;
                        end
                        tail <= T_QUEUE;
                        tail_len <= jmsg;
                    end
                    JOB_PUB_END: begin
                        q_pop <= 1'b1;
                        q_pop_len <= jmsg[QAW:0];
                        g <= G_IDLE;
                    end
                    JOB_CONNACK: begin
                        head[0] <= 8'h20; head[1] <= 8'h02; head[2] <= 8'h00;
                        head[3] <= jcode; head_len <= 3'd4;
                    end
                    JOB_PINGRESP: begin
                        head[0] <= 8'hD0; head[1] <= 8'h00; head_len <= 3'd2;
                    end
                    JOB_UNSUBACK: begin
                        head[0] <= 8'hB0; head[1] <= 8'h02; head[2] <= jpid[15:8];
                        head[3] <= jpid[7:0]; head_len <= 3'd4;
                    end
                    JOB_SUBACK_CODE: begin
                        codes[ncodes[3:0]] <= jcode;
                        ncodes <= ncodes + 1'b1;
                        g <= G_IDLE;
                    end
                    default: begin  // JOB_SUBACK_END: the last code, then the packet
                        codes[ncodes[3:0]] <= jcode;
                        ncodes <= 0;
                        head[0] <= 8'h90; head[1] <= {3'd0, ncodes} + 8'd3;
                        head[2] <= jpid[15:8]; head[3] <= jpid[7:0]; head_len <= 3'd4;
                        tail <= T_CODES;
                        tail_len <= {11'd0, ncodes} + 16'd1;
                    end
                endcase
            end
            G_HEAD: if (out_free) begin
                m_tvalid <= 1'b1;
                m_tdata <= head[hi];
                m_tlast <= hi == head_len - 1'b1 && tail == T_NONE;
                hi <= hi + 1'b1;
                if (hi == head_len - 1'b1)
                    g <= tail == T_NONE ? G_IDLE : G_TAIL;
            end
            G_TAIL: if (out_free) begin
                m_tvalid <= 1'b1;
                m_tdata <= tail == T_QUEUE ? q_rd_data : codes[ti[3:0]];
                m_tlast <= ti == tail_len - 1'b1;
                ti <= ti + 1'b1;
                if (ti == tail_len - 1'b1)
                    g <= G_IDLE;
            end
            default: g <= G_IDLE;
        endcase
    end
endmodule
`default_nettype wire

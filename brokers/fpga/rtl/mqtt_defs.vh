// Shared definitions of the FPGA MQTT broker (seed 000, section 5), included by each module.
// CRC-32 (IEEE, reflected, polynomial 0xEDB88320) over one byte, on zlib's "finished" value:
// crc32(a + b, seed) == fold of crc32_byte over b starting from crc32(a, seed), and
// crc32(b"", seed) == seed, so a hash is continued from any stored hash (tables.py uses
// zlib.crc32(key, seed)).
function automatic [31:0] crc32_byte(input [31:0] crc, input [7:0] data);
    reg [31:0] c;
    integer i;
    begin
        c = ~crc ^ {24'd0, data};
        for (i = 0; i < 8; i = i + 1)
            c = c[0] ? ((c >> 1) ^ 32'hEDB88320) : (c >> 1);
        crc32_byte = ~c;
    end
endfunction

localparam [31:0] TOPIC_SEED = 32'h00000000;        // tables.py _TOPIC_SEED
localparam [31:0] SUBSCRIBER_SEED = 32'h5BD1E995;   // tables.py _SUBSCRIBER_SEED

// Descriptor beats, parser -> lookup engine (one AXI4-Stream packet per MQTT packet, one
// beat per name to look up, or one beat for a packet without names): every beat is
// {header, name}, header = {op, pid, src, code, msg_len, topic_len} (the packet's, repeated
// in each beat, so a one-name packet is one beat), name = {crc0, crcS, len, refused}.
localparam OP_NONE = 3'd0, OP_CONNECT = 3'd1, OP_PUBLISH = 3'd2, OP_SUBSCRIBE = 3'd3,
           OP_UNSUBSCRIBE = 3'd4, OP_PINGREQ = 3'd5, OP_DISCONNECT = 3'd6;
localparam HDR_W = 3 + 16 + 48 + 8 + 16 + 16;      // 107 bits
localparam NAME_W = 32 + 32 + 16 + 1;              // 81 bits
localparam DESC_W = HDR_W + NAME_W;                // 188 bits

// Jobs, lookup engine -> packet generator.
localparam JOB_PUB_COPY = 3'd0, JOB_PUB_END = 3'd1, JOB_CONNACK = 3'd2, JOB_PINGRESP = 3'd3,
           JOB_UNSUBACK = 3'd4, JOB_SUBACK_CODE = 3'd5, JOB_SUBACK_END = 3'd6,
           JOB_PUB_COPY_END = 3'd7;   // a PUBLISH's last copy: sent, then the message popped
localparam JOB_W = 3 + 48 + 16 + 8 + 16 + 16;      // {op, addr, pid, code, msg_len, topic_len}

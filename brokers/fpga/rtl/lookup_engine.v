// Lookup engine (seed 000, 5.4): the Topic Table (key: topic name, value: number of
// subscribers, 12 bits) and the Subscriber Table (key: topic name + ID, value: destination
// IPv4 address and UDP port, 48 bits), both 65,536 words in block RAM, and three stages:
//
//   topic       read the name's probe window in the Topic Table: its count and word
//   subscriber  read `name + ID` for ID = 1..count, one ID per cycle (pipelined reads)
//   execute     add (SUBSCRIBE), tombstone and free (UNSUBSCRIBE), or send (PUBLISH)
//
// A PUBLISH's name has all three in one cycle after it is taken (both reads are issued as
// it is taken: the topic's window and ID 1's), and the next name is taken in that cycle:
// names with at most one subscriber follow one per cycle, each further subscriber adds a
// cycle. SUBSCRIBE, UNSUBSCRIBE and DISCONNECT go through the stages one after another
// (they write the tables; the next packet's reads come after their writes).
//
// A PUBLISH's jobs carry its descriptor's pid field unchanged: where the message lies in
// its message queue entries (mqtt_parser.v), for the packet generator.
//
// The table operations are tables.py's, word for word: home word CRC-32(key, seed) mod
// depth, 8-word probe window, refusal when no word of the window is free, IDs count + 1,
// at most 4,095 subscribers per filter, tombstones (0.0.0.0:0) on UNSUBSCRIBE with the
// trailing ones freed and a tombstone reused by the next SUBSCRIBE, a repeated SUBSCRIBE
// acknowledged without a second entry. Keys are not stored as bytes: a word holds the key's
// two CRC-32s (both tables' seeds) and its length, 80 bits, as its tag.
`default_nettype none
module lookup_engine #(
    parameter AW = 16
) (
    input  wire         clk,
    input  wire         rst,
    input  wire [187:0] d_tdata,     // DESC_W: {header, name} (mqtt_defs.vh)
    input  wire         d_tvalid,
    output wire         d_tready,
    input  wire         d_tlast,
    // jobs to the packet generator (a FIFO's write side)
    output reg          j_wr_en,
    output reg  [106:0] j_wr_data,
    input  wire         j_full,
    output wire         busy
);
    `include "mqtt_defs.vh"

    localparam TW = 1 + 80 + 12;   // {valid, tag, count}
    localparam SW = 1 + 80 + 48;   // {valid, tag, destination}
    localparam [11:0] MAX_COUNT = 12'd4095;

    localparam E_IDLE = 4'd0, E_NAME = 4'd1, E_TOPIC = 4'd2, E_SCAN = 4'd3,
               E_SUB_NEW = 4'd4, E_SUB_PUT = 4'd5, E_TRAIL_RD = 4'd6, E_TRAIL_CHK = 4'd7,
               E_TOPIC_WR = 4'd8, E_NEXT = 4'd9, E_DISC_RD = 4'd10, E_DISC_CHK = 4'd11,
               E_DISC_GO = 4'd12, E_DISC_NEXT = 4'd13, E_PUB = 4'd14;
    reg [3:0] state;

    // the packet
    reg [2:0]  op;
    reg [15:0] pid, msg_len, topic_len;
    reg [47:0] src;
    // the name being served
    reg [31:0] n_c0, n_cS;
    reg [15:0] n_len;
    reg        n_last;
    reg [7:0]  result;
    // topic stage
    reg        t_found, t_room;
    reg [AW-1:0] t_slot;
    reg [11:0] count;
    // subscriber stage
    reg [11:0] rid;
    reg        reuse_valid;
    reg [11:0] reuse_id;
    reg [AW-1:0] reuse_slot;
    // DISCONNECT: a walk over every Topic Table word, row by row
    reg [AW-4:0] disc_row;
    reg [2:0]    disc_k;
    // the row's first name at word disc_k or after (a row without one is passed in a cycle)
    reg          dw_found;
    reg [2:0]    dw_k;
    integer      di;
    always @(*) begin
        dw_found = 1'b0; dw_k = 3'd0;
        for (di = 0; di < 8; di = di + 1)
            if (!dw_found && di >= disc_k && t_words[di*TW + TW - 1]) begin
                dw_found = 1'b1; dw_k = di[2:0];
            end
    end
    wire [TW-1:0] disc_word = t_words[dw_k*TW +: TW];

    wire [79:0] n_tag = {n_c0, n_cS, n_len};

    // the descriptor beat: the packet's header and one name
    wire [106:0] d_hdr = d_tdata[187:81];
    wire [2:0]   d_op = d_hdr[106:104];
    wire         d_refused = d_tdata[0];
    wire         d_name_read = (d_op == OP_PUBLISH || d_op == OP_SUBSCRIBE ||
                                d_op == OP_UNSUBSCRIBE) && !(d_op == OP_SUBSCRIBE && d_refused);

    // a name beat taken (E_IDLE for a packet's first, E_NAME for the others): the Topic
    // Table's read is issued in the same cycle
    task take_name;
        begin
            {n_c0, n_cS, n_len} <= d_tdata[80:1];
            n_last <= d_tlast;
            result <= 8'd0;
            if (d_op == OP_SUBSCRIBE && d_refused) begin
                result <= 8'h80;              // a filter the hardware cannot serve
                state <= E_NEXT;
            end else
                state <= d_op == OP_PUBLISH ? E_PUB : E_TOPIC;
        end
    endtask

    function automatic [79:0] sub_tag(input [31:0] c0, input [31:0] cS, input [15:0] len,
                                      input [11:0] id);
        // tables._subscriber_key: name + NUL + ID as two big-endian bytes
        sub_tag = {crc32_byte(crc32_byte(crc32_byte(c0, 8'd0), {4'd0, id[11:8]}), id[7:0]),
                   crc32_byte(crc32_byte(crc32_byte(cS, 8'd0), {4'd0, id[11:8]}), id[7:0]),
                   len + 16'd3};
    endfunction

    // ---- tables -------------------------------------------------------------------------
    reg           t_rd_en, s_rd_en, t_wr_en, s_wr_en;
    reg  [AW-1:0] t_rd_home, s_rd_home, t_wr_slot, s_wr_slot;
    reg  [TW-1:0] t_wr_data;
    reg  [SW-1:0] s_wr_data;
    wire [8*TW-1:0] t_words;
    wire [8*SW-1:0] s_words;

    hash_table #(.DW(TW), .AW(AW)) topic_table (
        .clk(clk), .rd_en(t_rd_en), .rd_home(t_rd_home), .rd_words(t_words),
        .wr_en(t_wr_en), .wr_slot(t_wr_slot), .wr_data(t_wr_data));
    hash_table #(.DW(SW), .AW(AW)) subscriber_table (
        .clk(clk), .rd_en(s_rd_en), .rd_home(s_rd_home), .rd_words(s_words),
        .wr_en(s_wr_en), .wr_slot(s_wr_slot), .wr_data(s_wr_data));

    reg [AW-1:0] t_home_q, s_home_q;   // home word of the window on the read bus
    reg [79:0]   s_tag_q;              // key being looked up in the Subscriber Table

    // topic window: the name's word and the first free word
    reg        tw_found, tw_free;
    reg [2:0]  tw_k, tw_fk;
    reg [11:0] tw_count;
    integer i;
    always @(*) begin
        tw_found = 1'b0; tw_free = 1'b0; tw_k = 0; tw_fk = 0; tw_count = 0;
        for (i = 0; i < 8; i = i + 1) begin
            if (!tw_found && t_words[i*TW + TW - 1] && t_words[i*TW + 12 +: 80] == n_tag) begin
                tw_found = 1'b1; tw_k = i[2:0]; tw_count = t_words[i*TW +: 12];
            end
            if (!tw_free && !t_words[i*TW + TW - 1]) begin
                tw_free = 1'b1; tw_fk = i[2:0];
            end
        end
    end

    // subscriber window
    reg        sw_found, sw_free;
    reg [2:0]  sw_k, sw_fk;
    reg [47:0] sw_dest;
    always @(*) begin
        sw_found = 1'b0; sw_free = 1'b0; sw_k = 0; sw_fk = 0; sw_dest = 0;
        for (i = 0; i < 8; i = i + 1) begin
            if (!sw_found && s_words[i*SW + SW - 1] && s_words[i*SW + 48 +: 80] == s_tag_q) begin
                sw_found = 1'b1; sw_k = i[2:0]; sw_dest = s_words[i*SW +: 48];
            end
            if (!sw_free && !s_words[i*SW + SW - 1]) begin
                sw_free = 1'b1; sw_fk = i[2:0];
            end
        end
    end
    wire [AW-1:0] sw_slot = s_home_q + {{(AW - 3){1'b0}}, sw_k};
    wire [AW-1:0] sw_free_slot = s_home_q + {{(AW - 3){1'b0}}, sw_fk};
    wire [47:0] TOMBSTONE = 48'd0;

    // the scan (E_SCAN): ID rid's window on the read bus
    wire scan_copy = op == OP_PUBLISH && sw_found && sw_dest != TOMBSTONE;
    wire scan_stall = scan_copy && j_full;
    wire scan_stop = (op != OP_PUBLISH && sw_found && sw_dest == src) || rid == count;

    // ---- PUBLISH: one name per cycle --------------------------------------------------
    // Taking a PUBLISH's name issues both reads at once: its Topic Table window and the
    // Subscriber Table window of `name + 1` (ID 1, whose key needs only the name). In E_PUB
    // both are on the read buses: a name with at most one subscriber is served in that
    // cycle (its copy or nothing; the packet's last name's job also pops the message) and
    // the next PUBLISH name is taken in the same cycle, so names follow one per cycle. A
    // name with more subscribers goes on to the scan, ID 2 on.
    wire [11:0] p_count = tw_found ? tw_count : 12'd0;
    wire        p_copy = p_count != 0 && sw_found && sw_dest != TOMBSTONE;
    wire        p_many = p_count > 12'd1;
    wire        p_done = state == E_PUB && !j_full && !p_many;
    // ... and the scan's last ID of a PUBLISH's last name, when it is a copy, takes the
    // next PUBLISH as well: copies follow one per cycle across PUBLISHes
    wire        scan_last_copy = state == E_SCAN && scan_copy && scan_stop && n_last && !j_full;
    wire        pub_next = p_done || scan_last_copy;
    wire        pub_take = d_tvalid && d_op == OP_PUBLISH &&
                           ((state == E_IDLE && !j_full) || state == E_NAME || pub_next);

    // the key of ID `id` under the current name (or under the name being taken), and
    // where its window starts
    reg  [11:0] key_id;
    wire [79:0] key_tag = pub_take ? sub_tag(d_tdata[80:49], d_tdata[48:17], d_tdata[16:1], 12'd1)
                                   : sub_tag(n_c0, n_cS, n_len, key_id);
    wire [AW-1:0] key_home = key_tag[16 + 32 +: AW];   // CRC with the subscriber seed

    assign d_tready = (state == E_IDLE && !j_full) || state == E_NAME ||
                      (pub_next && d_op == OP_PUBLISH);
    assign busy = state != E_IDLE;

    always @(*) begin
        t_rd_en = 1'b0; t_rd_home = d_tdata[1 + 16 + 32 +: AW];  // entry beat's c0
        s_rd_en = 1'b0; s_rd_home = key_home;
        key_id = rid + 12'd1;
        case (state)
            E_IDLE: t_rd_en = d_tvalid && !j_full && d_name_read;
            E_NAME: t_rd_en = d_tvalid && d_name_read;
            E_TOPIC: begin
                key_id = 12'd1;
                s_rd_en = tw_found && tw_count != 0;
            end
            E_SCAN: key_id = rid + 12'd1;
            E_SUB_NEW: key_id = count + 12'd1;
            E_TRAIL_RD: key_id = count;
            E_DISC_RD: begin t_rd_en = 1'b1; t_rd_home = {disc_row, 3'b000}; end
            E_DISC_GO: begin key_id = 12'd1; s_rd_en = 1'b1; end
            E_PUB: begin key_id = 12'd2; s_rd_en = !j_full && p_many; end
            default: ;
        endcase
        if (pub_take) begin
            t_rd_en = 1'b1;
            s_rd_en = 1'b1;
        end
        // the scan issues the next ID's read unless it stops or waits
        if (state == E_SCAN)
            s_rd_en = !scan_stall && !scan_stop;
        if (state == E_SUB_NEW)
            s_rd_en = !(count == MAX_COUNT || (count == 0 && !t_room));
        if (state == E_TRAIL_RD)
            s_rd_en = 1'b1;
    end

    always @(posedge clk) begin
        j_wr_en <= 1'b0;
        t_wr_en <= 1'b0;
        s_wr_en <= 1'b0;
        if (t_rd_en) t_home_q <= t_rd_home;
        if (s_rd_en) begin s_home_q <= s_rd_home; s_tag_q <= key_tag; end
        if (rst) begin
            state <= E_IDLE;
        end else case (state)
            E_IDLE: if (d_tvalid && !j_full) begin
                {op, pid, src, result, msg_len, topic_len} <= d_hdr;
                case (d_op)
                    OP_CONNECT: begin
                        j_wr_en <= 1'b1;
                        j_wr_data <= {JOB_CONNACK, d_hdr[87:40], 16'd0, d_hdr[39:32], 32'd0};
                    end
                    OP_PINGREQ: begin
                        j_wr_en <= 1'b1;
                        j_wr_data <= {JOB_PINGRESP, d_hdr[87:40], 56'd0};
                    end
                    OP_PUBLISH, OP_SUBSCRIBE, OP_UNSUBSCRIBE: take_name;
                    OP_DISCONNECT: begin
                        // the model's clean session: every subscription of the address
                        // goes. The tables have no address index, so every Topic Table
                        // row is read (8 words, 2 cycles) and the IDs of each name in it
                        // scanned as by UNSUBSCRIBE.
                        disc_row <= 0;
                        disc_k <= 0;
                        n_last <= 1'b1;
                        state <= E_DISC_RD;
                    end
                    default: ;
                endcase
            end
            E_NAME: if (d_tvalid) take_name;
            E_TOPIC: begin                        // stage 1: topic
                t_found <= tw_found;
                t_room <= tw_found || tw_free;
                t_slot <= t_home_q + {{(AW - 3){1'b0}}, tw_found ? tw_k : tw_fk};
                count <= tw_found ? tw_count : 12'd0;
                rid <= 12'd0;
                reuse_valid <= 1'b0;
                if (tw_found && tw_count != 0) begin
                    rid <= 12'd1;
                    state <= E_SCAN;
                end else if (op == OP_SUBSCRIBE)
                    state <= E_SUB_NEW;
                else
                    state <= E_NEXT;              // nothing to send / nothing to remove
            end
            E_SCAN: if (!scan_stall) begin        // stage 2: subscriber, one ID per cycle
                if (scan_copy) begin              // the packet's last copy pops the message
                    j_wr_en <= 1'b1;
                    j_wr_data <= {scan_stop && n_last ? JOB_PUB_COPY_END : JOB_PUB_COPY,
                                  sw_dest, pid, 8'd0, msg_len, topic_len};
                end
                if (op == OP_SUBSCRIBE && sw_found && sw_dest == TOMBSTONE && !reuse_valid) begin
                    reuse_valid <= 1'b1; reuse_id <= rid; reuse_slot <= sw_slot;
                end
                if ((op == OP_UNSUBSCRIBE || op == OP_DISCONNECT) && sw_found &&
                    sw_dest == src) begin
                    s_wr_en <= 1'b1;              // stage 3: tombstone the entry
                    s_wr_slot <= sw_slot;
                    s_wr_data <= {1'b1, s_tag_q, TOMBSTONE};
                    state <= E_TRAIL_RD;
                end else if (scan_stop && scan_copy && n_last) begin
                    if (pub_take) begin           // popped by its last copy; the next one
                        {op, pid, src, result, msg_len, topic_len} <= d_hdr;
                        take_name;
                    end else
                        state <= E_IDLE;
                end else if (scan_stop) begin
                    if (op == OP_SUBSCRIBE && !(sw_found && sw_dest == src))
                        state <= reuse_valid || (sw_found && sw_dest == TOMBSTONE) ?
                                 E_SUB_PUT : E_SUB_NEW;
                    else
                        state <= E_NEXT;          // PUBLISH done, repeat SUBSCRIBE, unknown
                    if (op == OP_SUBSCRIBE && !reuse_valid && sw_found &&
                        sw_dest == TOMBSTONE) begin
                        reuse_valid <= 1'b1; reuse_id <= rid; reuse_slot <= sw_slot;
                    end
                end else
                    rid <= rid + 12'd1;
            end
            E_PUB: if (!j_full) begin             // stages 1-3 for a name, ID 1 at once
                if (p_many) begin                 // more subscribers: the scan, ID 2 on
                    if (p_copy) begin
                        j_wr_en <= 1'b1;
                        j_wr_data <= {JOB_PUB_COPY, sw_dest, pid, 8'd0, msg_len, topic_len};
                    end
                    count <= p_count;
                    rid <= 12'd2;
                    state <= E_SCAN;
                end else begin
                    if (p_copy || n_last) begin
                        j_wr_en <= 1'b1;
                        j_wr_data <= {p_copy ? (n_last ? JOB_PUB_COPY_END : JOB_PUB_COPY) :
                                      JOB_PUB_END, p_copy ? sw_dest : 48'd0, pid, 8'd0,
                                      msg_len, topic_len};
                    end
                    if (pub_take) begin
                        {op, pid, src, result, msg_len, topic_len} <= d_hdr;
                        take_name;
                    end else
                        state <= n_last ? E_IDLE : E_NAME;
                end
            end
            E_SUB_NEW: begin                      // new ID = count + 1 (read issued here)
                if (count == MAX_COUNT || (count == 0 && !t_room)) begin
                    result <= 8'h80;
                    state <= E_NEXT;
                end else
                    state <= E_SUB_PUT;
                reuse_valid <= 1'b0;
            end
            E_SUB_PUT: begin                      // stage 3: add the subscriber
                if (reuse_valid) begin
                    s_wr_en <= 1'b1;
                    s_wr_slot <= reuse_slot;
                    s_wr_data <= {1'b1, sub_tag(n_c0, n_cS, n_len, reuse_id), src};
                    state <= E_NEXT;
                end else if (!sw_found && !sw_free) begin
                    result <= 8'h80;              // the Subscriber Table refuses the key
                    state <= E_NEXT;
                end else begin
                    s_wr_en <= 1'b1;
                    s_wr_slot <= sw_found ? sw_slot : sw_free_slot;
                    s_wr_data <= {1'b1, s_tag_q, src};
                    count <= count + 12'd1;
                    state <= E_TOPIC_WR;
                end
            end
            E_TRAIL_RD: state <= E_TRAIL_CHK;    // read ID `count`
            E_TRAIL_CHK: begin                    // free trailing tombstones
                if (sw_found && sw_dest == TOMBSTONE) begin
                    s_wr_en <= 1'b1;
                    s_wr_slot <= sw_slot;
                    s_wr_data <= {SW{1'b0}};
                    count <= count - 12'd1;
                    state <= count == 12'd1 ? E_TOPIC_WR : E_TRAIL_RD;
                end else
                    state <= E_TOPIC_WR;
            end
            E_TOPIC_WR: begin                     // the name's count, or its word freed
                t_wr_en <= 1'b1;
                t_wr_slot <= t_slot;
                t_wr_data <= count == 0 ? {TW{1'b0}} : {1'b1, n_tag, count};
                state <= E_NEXT;
            end
            E_NEXT: if (!j_full) begin            // the name is served: answer, next name
                case (op)
                    OP_SUBSCRIBE: begin
                        j_wr_en <= 1'b1;
                        j_wr_data <= {n_last ? JOB_SUBACK_END : JOB_SUBACK_CODE, src, pid,
                                      result, 32'd0};
                    end
                    OP_UNSUBSCRIBE: if (n_last) begin
                        j_wr_en <= 1'b1;
                        j_wr_data <= {JOB_UNSUBACK, src, pid, 40'd0};
                    end
                    OP_DISCONNECT: ;
                    default: if (n_last) begin   // PUBLISH: the message leaves the queue
                        j_wr_en <= 1'b1;
                        j_wr_data <= {JOB_PUB_END, 48'd0, pid, 8'd0, msg_len, topic_len};
                    end
                endcase
                state <= op == OP_DISCONNECT ? E_DISC_NEXT : n_last ? E_IDLE : E_NAME;
            end
            E_DISC_RD: state <= E_DISC_CHK;       // a row: 8 words, one per bank
            E_DISC_CHK: begin
                if (dw_found) begin                // a name: its tag, count and word
                    {n_c0, n_cS, n_len} <= disc_word[12 +: 80];
                    count <= disc_word[11:0];
                    t_slot <= {disc_row, dw_k};
                    disc_k <= dw_k;
                    rid <= 12'd1;
                    state <= E_DISC_GO;
                end else if (&disc_row)
                    state <= E_IDLE;
                else begin                         // no more names in the row
                    disc_row <= disc_row + 1'b1;
                    disc_k <= 3'd0;
                    state <= E_DISC_RD;
                end
            end
            E_DISC_GO: state <= E_SCAN;           // ID 1's read is issued now
            E_DISC_NEXT: begin
                disc_k <= disc_k + 3'd1;
                if (disc_k != 3'd7)
                    state <= E_DISC_CHK;          // the row's words stay on the read bus
                else if (&disc_row)
                    state <= E_IDLE;
                else begin
                    disc_row <= disc_row + 1'b1;
                    state <= E_DISC_RD;
                end
            end
            default: state <= E_IDLE;
        endcase
    end
endmodule
`default_nettype wire

/* Fine-grained overhead pipelining firmware: eudp's model of paper 000
 * §4.3 (Fig. 6, Table 1). Written for eudp; not the paper's model.
 *
 * One NIC processor runs four threads: SDMA (host -> NIC memory), SEND
 * (NIC memory -> link), RECV (link -> NIC memory) and RDMA (NIC memory ->
 * host). SDMA and RDMA share the single host DMA engine. Each step of a
 * thread is one atomic block: the thread runs until it reaches its next
 * dispatching state and then yields the processor; which ready thread runs
 * next is left to the scheduler (any of them). A DMA in flight is a state of
 * its thread; the DMA engine works while other threads run, and the thread
 * sees its completion when next dispatched.
 *
 * Packets are counted in chunks: a small packet (1 chunk) is below the
 * fine-grained threshold and moves whole (coarse); a large one (3 chunks)
 * may be sent or delivered in fragments while its later chunks are still
 * arriving (fine). Two NIC buffers per direction allow coarse pipelining
 * across packets. The host posts sends and the network delivers packets at
 * any time.
 *
 * Deliberately broken variants (prepended #defines):
 *   BROKEN_NO_DMA_LOCK  RDMA starts host DMA without owning the engine
 *   BROKEN_SERIALIZED   one DMA at a time in the whole NIC (no pipelining)
 *   BROKEN_COARSE_ONLY  fine-grained states disabled (coarse pipelining only)
 *   BROKEN_NO_ARBITRATION  the host DMA engine goes to whichever thread asks
 *                       first, so one direction can starve the other
 */

#define SMALL  1
#define LARGE  3
#define THRESH 1   /* chunks needed before a fragment may start */
#define NBUF   2

mtype = {
  S_Idle, Sdma, Sdma_Done,                                        /* SDMA */
  T_Idle, Coarse_Grained_Send, Fine_Grained_Send,
          Fine_Grained_Send_Done, Send_Last_Fragment,             /* SEND */
  V_Idle, Recv,                                                   /* RECV */
  R_Idle, Coarse_Grained_Rdma, Fine_Grained_Rdma,
          Fine_Grained_Rdma_Done, Rdma_Last_Fragment              /* RDMA */
};

mtype SDMA_state = S_Idle, SEND_state = T_Idle, RECV_state = V_Idle, RDMA_state = R_Idle;

/* the host DMA engine: 0 free, 1 held by SDMA, 2 held by RDMA */
byte hdma;

/* arrivals not yet picked up (at most one waiting on each side) */
bool host_req, net_pkt;

/* send buffers: size (0 = free), chunks moved in by SDMA, chunks sent */
byte s_size[NBUF], s_in[NBUF], s_out[NBUF];
byte s_fill, s_tx;        /* buffer SDMA fills, buffer SEND drains */
byte tx_n;                /* chunks in the fragment SEND is sending */

/* receive buffers: size, chunks received from the link, chunks moved to host */
byte r_size[NBUF], r_in[NBUF], r_out[NBUF];
byte r_fill, r_dma;       /* buffer RECV fills, buffer RDMA drains */
byte rx_n;                /* chunks in the fragment RDMA is moving */

#ifdef BROKEN_COARSE_ONLY
#define FINE false
#else
#define FINE true
#endif

/* a buffer RECV has finished with is complete */
#define R_COMPLETE (r_size[r_dma] > 0 && r_in[r_dma] == r_size[r_dma] && !(RECV_state == Recv && r_fill == r_dma))

/* Which thread wants the host DMA engine now: the conditions, other than the
 * engine being free, under which it would start a host DMA. */
#define SDMA_WANTS ((SDMA_state == S_Idle && host_req && s_size[s_fill] == 0) || \
                    (SDMA_state == Sdma_Done && s_in[s_fill] < s_size[s_fill]))
#define RDMA_FINE_READY (FINE && r_size[r_dma] > 0 && r_in[r_dma] < r_size[r_dma] && \
                         r_in[r_dma] - r_out[r_dma] >= THRESH)
#define RDMA_WANTS ((RDMA_state == R_Idle && (R_COMPLETE || RDMA_FINE_READY)) || \
                    (RDMA_state == Fine_Grained_Rdma_Done && (R_COMPLETE || RDMA_FINE_READY)))

/* Arbitration of the host DMA engine: when both threads want it, the one
 * that did not have it last goes first. Without it (the plain reading of
 * Fig. 6) a busy direction can starve the other under weak fairness. */
byte turn = 1;   /* 1: SDMA goes first on a tie, 2: RDMA */
#ifdef BROKEN_NO_ARBITRATION
#define SDMA_MAY_TAKE (hdma == 0)
#define RDMA_MAY_TAKE (hdma == 0)
#else
#define SDMA_MAY_TAKE (hdma == 0 && (turn == 1 || !RDMA_WANTS))
#ifdef BROKEN_NO_DMA_LOCK
#define RDMA_MAY_TAKE true
#else
#define RDMA_MAY_TAKE (hdma == 0 && (turn == 2 || !SDMA_WANTS))
#endif
#endif

#ifdef BROKEN_SERIALIZED
#define QUIET (SDMA_state != Sdma && RECV_state != Recv && \
               (SEND_state == T_Idle || SEND_state == Fine_Grained_Send_Done) && \
               (RDMA_state == R_Idle || RDMA_state == Fine_Grained_Rdma_Done))
#else
#define QUIET true
#endif

/* Table 1's propositions. The last-fragment states are DMA states of the
 * fine-grained path, so they count as fine. */
#define sdma        (SDMA_state == Sdma)
#define coarse_rdma (RDMA_state == Coarse_Grained_Rdma)
#define fine_rdma   (RDMA_state == Fine_Grained_Rdma || RDMA_state == Rdma_Last_Fragment)
#define coarse_send (SEND_state == Coarse_Grained_Send)
#define fine_send   (SEND_state == Fine_Grained_Send || SEND_state == Send_Last_Fragment)
#define recv        (RECV_state == Recv)

active proctype host() {
  do
  :: atomic { !host_req -> host_req = true; printf("@@ host  posts a send\n") }
  od
}

active proctype network() {
  do
  :: atomic { !net_pkt -> net_pkt = true; printf("@@ net   a packet arrives\n") }
  od
}

active proctype SDMA() {
  do
  :: atomic { SDMA_state == S_Idle && host_req && s_size[s_fill] == 0 && SDMA_MAY_TAKE && QUIET ->
       host_req = false;
       if :: s_size[s_fill] = SMALL :: s_size[s_fill] = LARGE fi;
       hdma = 1; SDMA_state = Sdma;
       printf("@@ SDMA  host DMA of send buffer %d (packet of %d chunks) starts\n", s_fill, s_size[s_fill]) }
  :: atomic { SDMA_state == Sdma ->                  /* one chunk has arrived */
       s_in[s_fill]++; hdma = 0; turn = 2; SDMA_state = Sdma_Done;
       printf("@@ SDMA  chunk %d of %d in NIC memory, host DMA released\n", s_in[s_fill], s_size[s_fill]) }
  :: atomic { SDMA_state == Sdma_Done && s_in[s_fill] < s_size[s_fill] && SDMA_MAY_TAKE && QUIET ->
       hdma = 1; SDMA_state = Sdma; printf("@@ SDMA  host DMA of the next chunk starts\n") }
  :: atomic { SDMA_state == Sdma_Done && s_in[s_fill] == s_size[s_fill] ->
       s_fill = (s_fill + 1) % NBUF; SDMA_state = S_Idle; printf("@@ SDMA  packet complete\n") }
  od
}

active proctype SEND() {
  do
  /* whole packet in NIC memory: coarse-grained send */
  :: atomic { SEND_state == T_Idle && s_size[s_tx] > 0 && s_in[s_tx] == s_size[s_tx] && QUIET ->
       SEND_state = Coarse_Grained_Send; printf("@@ SEND  whole packet of buffer %d on the link (coarse)\n", s_tx) }
  :: atomic { SEND_state == Coarse_Grained_Send ->
       s_size[s_tx] = 0; s_in[s_tx] = 0; s_out[s_tx] = 0;
       s_tx = (s_tx + 1) % NBUF; SEND_state = T_Idle; printf("@@ SEND  packet sent\n") }
  /* part of a large packet present: send it as a fragment */
  :: atomic { (SEND_state == T_Idle || SEND_state == Fine_Grained_Send_Done) && FINE &&
              s_size[s_tx] > 0 && s_in[s_tx] < s_size[s_tx] && s_in[s_tx] - s_out[s_tx] >= THRESH && QUIET ->
       tx_n = s_in[s_tx] - s_out[s_tx]; SEND_state = Fine_Grained_Send;
       printf("@@ SEND  fragment of %d chunk(s) of buffer %d on the link (fine)\n", tx_n, s_tx) }
  :: atomic { SEND_state == Fine_Grained_Send ->
       s_out[s_tx] = s_out[s_tx] + tx_n; tx_n = 0; SEND_state = Fine_Grained_Send_Done; printf("@@ SEND  fragment sent\n") }
  /* SDMA has finished the packet: send the rest whatever its size */
  :: atomic { SEND_state == Fine_Grained_Send_Done && s_in[s_tx] == s_size[s_tx] && QUIET ->
       SEND_state = Send_Last_Fragment; printf("@@ SEND  last fragment of buffer %d on the link\n", s_tx) }
  :: atomic { SEND_state == Send_Last_Fragment ->
       s_size[s_tx] = 0; s_in[s_tx] = 0; s_out[s_tx] = 0;
       s_tx = (s_tx + 1) % NBUF; SEND_state = T_Idle; printf("@@ SEND  packet sent\n") }
  od
}

active proctype RECV() {
  do
  :: atomic { RECV_state == V_Idle && net_pkt && r_size[r_fill] == 0 && QUIET ->
       net_pkt = false;
       if :: r_size[r_fill] = SMALL :: r_size[r_fill] = LARGE fi;
       RECV_state = Recv; printf("@@ RECV  receive DMA of a %d-chunk packet into buffer %d starts\n", r_size[r_fill], r_fill) }
  /* the receive DMA engine writes the packet chunk by chunk */
  :: atomic { RECV_state == Recv && r_in[r_fill] < r_size[r_fill] ->
       r_in[r_fill]++; printf("@@ RECV  chunk %d of %d in NIC memory\n", r_in[r_fill], r_size[r_fill]) }
  :: atomic { RECV_state == Recv && r_in[r_fill] == r_size[r_fill] ->
       r_fill = (r_fill + 1) % NBUF; RECV_state = V_Idle; printf("@@ RECV  packet received\n") }
  od
}

active proctype RDMA() {
  do
  /* whole packet received: coarse-grained host DMA */
  :: atomic { RDMA_state == R_Idle && R_COMPLETE && RDMA_MAY_TAKE && QUIET ->
       hdma = 2; RDMA_state = Coarse_Grained_Rdma; printf("@@ RDMA  host DMA of whole buffer %d starts (coarse)\n", r_dma) }
  :: atomic { RDMA_state == Coarse_Grained_Rdma ->
       hdma = 0; turn = 1; r_size[r_dma] = 0; r_in[r_dma] = 0; r_out[r_dma] = 0;
       r_dma = (r_dma + 1) % NBUF; RDMA_state = R_Idle; printf("@@ RDMA  packet delivered, host DMA released\n") }
  /* still receiving, enough arrived: move a fragment to the host */
  :: atomic { (RDMA_state == R_Idle || RDMA_state == Fine_Grained_Rdma_Done) && FINE &&
              r_size[r_dma] > 0 && r_in[r_dma] < r_size[r_dma] && r_in[r_dma] - r_out[r_dma] >= THRESH &&
              RDMA_MAY_TAKE && QUIET ->
       rx_n = r_in[r_dma] - r_out[r_dma]; hdma = 2; RDMA_state = Fine_Grained_Rdma;
       printf("@@ RDMA  host DMA of a %d-chunk fragment of buffer %d starts (fine)\n", rx_n, r_dma) }
  :: atomic { RDMA_state == Fine_Grained_Rdma ->
       r_out[r_dma] = r_out[r_dma] + rx_n; rx_n = 0; hdma = 0; turn = 1; RDMA_state = Fine_Grained_Rdma_Done; printf("@@ RDMA  fragment delivered, host DMA released\n") }
  /* receive complete: move the rest whatever its size */
  :: atomic { RDMA_state == Fine_Grained_Rdma_Done && R_COMPLETE && RDMA_MAY_TAKE && QUIET ->
       hdma = 2; RDMA_state = Rdma_Last_Fragment; printf("@@ RDMA  host DMA of the last fragment of buffer %d starts\n", r_dma) }
  :: atomic { RDMA_state == Rdma_Last_Fragment ->
       hdma = 0; turn = 1; r_size[r_dma] = 0; r_in[r_dma] = 0; r_out[r_dma] = 0;
       r_dma = (r_dma + 1) % NBUF; RDMA_state = R_Idle; printf("@@ RDMA  packet delivered, host DMA released\n") }
  od
}

/* Table 1, formulas 1-3: each overlap is reachable. Checked as the negation
 * `[] !overlap`, which Spin must report violated (the trail is a witness). */
ltl f1_sdma_send { [] !(sdma && (coarse_send || fine_send)) }
ltl f2_rdma_recv { [] !((coarse_rdma || fine_rdma) && recv) }
ltl f3_send_recv { [] !((coarse_send || fine_send) && recv) }
/* Table 1, formula 4 (with the negation its text intends): SDMA and RDMA
 * never hold the host DMA engine together. Must hold. */
ltl f4_host_dma_exclusive { [] !(sdma && (coarse_rdma || fine_rdma)) }
/* Fine-grained proper: a fragment of a packet goes out on the link while
 * SDMA is still moving the same packet, and a fragment of a packet goes to
 * the host while RECV is still receiving it. Reachable (negations violated). */
ltl fine_tx_same_packet { [] !(sdma && SEND_state == Fine_Grained_Send && s_tx == s_fill) }
ltl fine_rx_same_packet { [] !(recv && RDMA_state == Fine_Grained_Rdma && r_dma == r_fill) }
/* Progress under weak fairness: a posted send eventually gets its host DMA,
 * and an arriving packet is eventually received. Checked with -a -f. */
ltl tx_progress { [] (host_req -> <> sdma) }
ltl rx_progress { [] (net_pkt -> <> recv) }

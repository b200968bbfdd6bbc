/* eudp engine: two-level send queue. GENERATED from crates/engine/src/machine.rs
 * by `eudp verify --emit-promela`; edit the table there, not this file.
 *
 *   DirectPost  App        caller: L1 empty, L2 below its bound and no batch in the backend -> post on the caller's thread
 *   Enqueue     App        caller: L1 has room -> queue in L1 (always when L1 is busy or L2 full; by choice when streaming)
 *   Refuse      App        caller: shut down, or L1 full -> refused
 *   DirectDone  App        caller: its backend operation returned; the L2 slot stays taken until the engine reaps it
 *   DirectRetire App        caller: its backend operation returned, L1 empty; nobody waits for the slot, the caller may free it
 *   Reap        Engine/App engine (or a draining caller): reap n completed direct posts, freeing their L2 slots (self-clocking)
 *   TakeBatch   Engine/App engine (or a caller that found a batch queued): L2 has room and no batch in the backend -> move 1..l1 datagrams from L1 into one descriptor
 *   BatchDone   Engine/App whoever took the batch: its backend operation returned; reaped at once
 *   Shutdown    Closer     closer: no new posts; the engine flushes
 */
#define NAPPS 3
#define PER_APP 2
#define NDG 6
#define L2_BOUND 2
#define L1_CAP 2

/* the table's variables: QueueState plus ghost counters */
byte l1;
byte l2;
byte done_unreaped;
bool shutdown;
byte direct_inflight;
byte batch_inflight;

/* where every datagram is: the model's own bookkeeping, checked against the table */
chan l1q = [NDG] of { byte };  /* ids queued in L1, FIFO */
bit acc[NDG];        /* accepted (direct post or L1) */
bit hnd[NDG];        /* handed to the backend */
byte accepted, refused, in_desc, handed;
bool dup;            /* some datagram handed twice */
bool engine_done;
byte watch;          /* the datagram the liveness claim follows */

#define flush_done ((shutdown == 1) && (l1 == 0) && (l2 == 0))
#define flushed (engine_done && l1 == 0 && l2 == 0 && handed == accepted)
#define conserved (!dup && accepted + refused <= NDG && accepted == len(l1q) + in_desc + handed && l1 == len(l1q))
#define table_invariants ((l1 <= L1_CAP) && (done_unreaped <= l2) && (l2 == (direct_inflight + batch_inflight + done_unreaped)))

inline hand(id) {
  if
  :: hnd[id] -> dup = true; printf("@@   backend gets #%d AGAIN\n", id)
  :: else -> hnd[id] = 1; printf("@@   backend gets #%d\n", id)
  fi;
  handed++;
  in_desc--
}

proctype app(byte me) {
  byte k, id, b[NDG], nb, i, tmp0, tmp1, tmp2;
  do
  :: k < PER_APP ->
     id = me * PER_APP + k; k++;
     if
     :: atomic { ((shutdown == 0) && ((l1 == 0) && (l2 < L2_BOUND) && (batch_inflight == 0))) -> l2 = l2 + 1; direct_inflight = direct_inflight + 1; acc[id] = 1; accepted++; in_desc++; printf("@@ app%d DirectPost #%d  -> l1=%d l2=%d done=%d shutdown=%d\n", me, id, l1, l2, done_unreaped, shutdown) };
        atomic { hand(id) };   /* the caller's own backend operation */
        if
        :: atomic { ((direct_inflight > 0) && (done_unreaped < l2)) -> direct_inflight = direct_inflight - 1; done_unreaped = done_unreaped + 1; printf("@@ app%d DirectDone #%d  -> l1=%d l2=%d done=%d shutdown=%d\n", me, id, l1, l2, done_unreaped, shutdown) }
        :: atomic { ((direct_inflight > 0) && (done_unreaped < l2) && (l1 == 0)) -> direct_inflight = direct_inflight - 1; l2 = l2 - 1; printf("@@ app%d DirectRetire #%d  -> l1=%d l2=%d done=%d shutdown=%d\n", me, id, l1, l2, done_unreaped, shutdown) }
        fi
     :: atomic { ((shutdown == 0) && !((l1 >= 1) && (l1 >= L1_CAP))) -> l1 = l1 + 1; l1q!id; acc[id] = 1; accepted++; printf("@@ app%d Enqueue #%d  -> l1=%d l2=%d done=%d shutdown=%d\n", me, id, l1, l2, done_unreaped, shutdown) };
        if   /* the caller drains L1 itself, as the engine would */
        :: atomic { ((1 >= 1) && (1 <= done_unreaped)) -> l2 = l2 - 1; done_unreaped = done_unreaped - 1; printf("@@ app%d Reap(1)  -> l1=%d l2=%d done=%d shutdown=%d\n", me, l1, l2, done_unreaped, shutdown) }
        :: atomic { ((2 >= 1) && (2 <= done_unreaped)) -> l2 = l2 - 2; done_unreaped = done_unreaped - 2; printf("@@ app%d Reap(2)  -> l1=%d l2=%d done=%d shutdown=%d\n", me, l1, l2, done_unreaped, shutdown) }
        :: skip
        fi;
        if
        :: atomic { ((1 >= 1) && (1 <= l1) && (l2 < L2_BOUND) && (batch_inflight == 0)) -> l1 = l1 - 1; l2 = l2 + 1; batch_inflight = batch_inflight + 1; nb = 1; in_desc = in_desc + 1; do :: i < nb -> l1q?b[i]; i++ :: else -> break od; i = 0; printf("@@ app%d TakeBatch(1)  -> l1=%d l2=%d done=%d shutdown=%d\n", me, l1, l2, done_unreaped, shutdown) }
        :: atomic { ((2 >= 1) && (2 <= l1) && (l2 < L2_BOUND) && (batch_inflight == 0)) -> l1 = l1 - 2; l2 = l2 + 1; batch_inflight = batch_inflight + 1; nb = 2; in_desc = in_desc + 2; do :: i < nb -> l1q?b[i]; i++ :: else -> break od; i = 0; printf("@@ app%d TakeBatch(2)  -> l1=%d l2=%d done=%d shutdown=%d\n", me, l1, l2, done_unreaped, shutdown) }
        :: skip
        fi;
        if
        :: nb > 0 ->
           atomic { do :: i < nb -> hand(b[i]); b[i] = 0; i++ :: else -> break od; i = 0; nb = 0 };
           atomic { ((batch_inflight > 0) && (done_unreaped < l2)) -> batch_inflight = batch_inflight - 1; l2 = l2 - 1; printf("@@ app%d BatchDone  -> l1=%d l2=%d done=%d shutdown=%d\n", me, l1, l2, done_unreaped, shutdown) }
        :: else -> skip
        fi
     :: atomic { ((shutdown == 1) || ((l1 >= 1) && (l1 >= L1_CAP))) -> refused++; printf("@@ app%d Refuse #%d  -> l1=%d l2=%d done=%d shutdown=%d\n", me, id, l1, l2, done_unreaped, shutdown) }
     fi;
     tmp0 = 0; tmp1 = 0; tmp2 = 0; id = 0
  :: else -> break
  od
}

proctype engine() {
  byte b[NDG], nb, i, tmp0, tmp1, tmp2;
loop:
  do
  :: atomic { ((1 >= 1) && (1 <= done_unreaped)) -> l2 = l2 - 1; done_unreaped = done_unreaped - 1; printf("@@ engine Reap(1)  -> l1=%d l2=%d done=%d shutdown=%d\n", l1, l2, done_unreaped, shutdown) }
  :: atomic { ((2 >= 1) && (2 <= done_unreaped)) -> l2 = l2 - 2; done_unreaped = done_unreaped - 2; printf("@@ engine Reap(2)  -> l1=%d l2=%d done=%d shutdown=%d\n", l1, l2, done_unreaped, shutdown) }
  :: atomic { ((1 >= 1) && (1 <= l1) && (l2 < L2_BOUND) && (batch_inflight == 0)) -> l1 = l1 - 1; l2 = l2 + 1; batch_inflight = batch_inflight + 1; nb = 1; in_desc = in_desc + 1; do :: i < nb -> l1q?b[i]; i++ :: else -> break od; i = 0; printf("@@ engine TakeBatch(1)  -> l1=%d l2=%d done=%d shutdown=%d\n", l1, l2, done_unreaped, shutdown) };
     goto batch
  :: atomic { ((2 >= 1) && (2 <= l1) && (l2 < L2_BOUND) && (batch_inflight == 0)) -> l1 = l1 - 2; l2 = l2 + 1; batch_inflight = batch_inflight + 1; nb = 2; in_desc = in_desc + 2; do :: i < nb -> l1q?b[i]; i++ :: else -> break od; i = 0; printf("@@ engine TakeBatch(2)  -> l1=%d l2=%d done=%d shutdown=%d\n", l1, l2, done_unreaped, shutdown) };
     goto batch
  :: atomic { flush_done -> engine_done = true; printf("@@ engine stops  -> l1=%d l2=%d done=%d shutdown=%d\n", l1, l2, done_unreaped, shutdown) }; break
  od;
  goto fin;
batch:   /* the engine's backend operation: one descriptor of nb datagrams */
  atomic { do :: i < nb -> hand(b[i]); b[i] = 0; i++ :: else -> break od; i = 0; nb = 0 };
  atomic { ((batch_inflight > 0) && (done_unreaped < l2)) -> batch_inflight = batch_inflight - 1; l2 = l2 - 1; printf("@@ engine BatchDone  -> l1=%d l2=%d done=%d shutdown=%d\n", l1, l2, done_unreaped, shutdown) };
  tmp0 = 0; tmp1 = 0; tmp2 = 0;
  goto loop;
fin:
  skip
}

proctype closer() {
  byte tmp0;
  atomic { true -> shutdown = 1; printf("@@ closer Shutdown  -> l1=%d l2=%d done=%d shutdown=%d\n", l1, l2, done_unreaped, shutdown) }
}

init {
  atomic {
    select(watch : 0 .. NDG - 1);
    run engine();
    run closer();
    run app(0);
    run app(1);
    run app(2);
  }
}

/* L2 never holds more descriptors than its bound */
ltl l2_bound { [] (l2 <= L2_BOUND) }
/* every datagram is in exactly one place (L1, a descriptor, handed) and
   the table's counters agree with where the datagrams are */
ltl conservation { [] (conserved && table_invariants) }
/* every accepted datagram is eventually handed to the backend (-a -f) */
ltl eventually_handed { [] (acc[watch] -> <> hnd[watch]) }
/* after shutdown the engine eventually stops with L1 and L2 empty (-a -f) */
ltl flush_completes { [] (shutdown -> <> flushed) }

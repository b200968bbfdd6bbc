/* eudp EMP flow: selective repeat with cumulative acks and NAKs. GENERATED from
 * crates/engine/src/emp/table.rs by `eudp verify --emit-promela`; edit the table there.
 *
 *   SendNew    sender: not going back and the window has room -> transmit the next new frame
 *   Resend     sender: going back -> transmit again the frame ptr names, sent before and not acknowledged
 *   Repair     sender: a frame in [base, ptr) reported missing, or the oldest after a timeout -> transmit it again alone
 *   AckIn      sender: cumulative ack in [base, top] -> release the frames below it; no resend of released frames
 *   NakIn      sender: NAK in [base, top] -> release the frames below it; the frame it names is repaired
 *   Timeout    sender: timer fired with frames unacknowledged -> the oldest is repaired
 *   GoBack     sender: frames from one in [base, ptr) on never reached the wire -> send them again from there
 *   GiveUp     sender: deadline passed without progress -> the unacknowledged frames complete with an error
 *   Accept     receiver: the expected frame, fewer than W accepted since the last ack or NAK -> accept it
 *   Duplicate  receiver: a frame no sender within the window can send as new -> duplicate, dropped (and acked)
 *   Gap        receiver: a frame above the expected one, within the window, held already -> dropped
 *   Hold       receiver: a frame above the expected one, within the window -> held until it is the expected one
 *   Unmatched  receiver: the expected first frame of a message matches no posted receive -> dropped, not acked
 *   AckOut     receiver: acknowledge every frame below the expected one, as of the moment the ack is sent
 *   AckDelayed receiver: acknowledge every frame below the expected one later: on a reverse data frame or alone
 *   NakOut     receiver: a gap and no NAK out for it yet -> NAK naming the expected frame (once per gap)
 */
#define N 6
#define FPM 1
#define W 2
#define G 2
#define S 5
#define C 8
#define LOSS 1
#define DUPS 1
#define REORD 1
#define EARLY 1
#define UNM 1

/* the table's variables: sender, then receiver */
byte base, ptr, top;
byte exp, since;
bit gap_seen, nak_sent;
bit parked; byte parked_v;   /* an acknowledgment parked to leave later, and its wire value */
byte unacked;                /* frames accepted since an acknowledgment left at once (the group's count) */
byte held[S];   /* the receiver's held frames: index + 1 per wire number, 0 when none */

chan data = [C] of { byte, byte };  /* wire sequence number (mod S), ghost: the frame's index */
chan acks = [C] of { bit, byte };   /* 0 ack / 1 NAK, wire sequence number (mod S) */

/* impairments spent, and ghosts */
byte lost, duped, reordered, early, unmatched;
byte data_drops, ack_drops;   /* frames lost or unmatched; acks or NAKs lost */
bool misdelivered;            /* a frame accepted that is not the flow's next */
bool stall_with_gap;          /* a gap left for the timer to repair */

#define table_invariants (((ptr - base) <= (top - base)) && ((top - ptr) <= (top - base)) && ((top - base) <= W) && (since <= W))

inline send_data(s, id) {
  if
  :: lost < LOSS -> lost++; data_drops++; printf("@@   frame %d (#%d) lost\n", s, id)
  :: duped < DUPS && len(data) + 2 <= C -> data!s,id; data!s,id; duped++; printf("@@   frame %d (#%d) doubled\n", s, id)
  :: nfull(data) -> data!s,id
  :: full(data) -> data_drops++; printf("@@   frame %d (#%d) dropped: channel full\n", s, id)
  fi
}

inline send_ack(k, v) {
  if
  :: lost < LOSS -> lost++; ack_drops++; printf("@@   ack/nak %d lost\n", v)
  :: duped < DUPS && len(acks) + 2 <= C -> acks!k,v; acks!k,v; duped++; printf("@@   ack/nak %d doubled\n", v)
  :: nfull(acks) -> acks!k,v
  :: full(acks) -> ack_drops++; printf("@@   ack/nak %d dropped: channel full\n", v)
  fi
}

/* the two oldest messages of ch swap places; the others keep their order */
inline swap_head(ch) {
  n = len(ch); ch?a1,b1; ch?a2,b2; ch!a2,b2; ch!a1,b1;
  do :: n > 2 -> ch?a1,b1; ch!a1,b1; n-- :: else -> break od;
  a1 = 0; b1 = 0; a2 = 0; b2 = 0; n = 0; reordered++
}

proctype sender() {
  byte id, k, v, n, a1, b1, a2, b2;
  do
  :: base == N -> break
  :: atomic { top < N && ((ptr == top) && ((((0) % S + S - (top) % S) % S) == 0) && ((top - base) < W)) -> id = ptr; top = (top + 1); ptr = (ptr + 1); printf("@@ sender SendNew 0 (#%d)  base=%d top=%d\n", id, base, top); send_data(0, id); id = 0 }
  :: atomic { (((top - ptr) >= 1) && ((((0) % S + S - (ptr) % S) % S) == 0)) -> id = ptr; ptr = (ptr + 1); printf("@@ sender Resend 0 (#%d)  base=%d top=%d\n", id, base, top); send_data(0, id); id = 0 }
  :: atomic { top < N && ((ptr == top) && ((((1) % S + S - (top) % S) % S) == 0) && ((top - base) < W)) -> id = ptr; top = (top + 1); ptr = (ptr + 1); printf("@@ sender SendNew 1 (#%d)  base=%d top=%d\n", id, base, top); send_data(1, id); id = 0 }
  :: atomic { (((top - ptr) >= 1) && ((((1) % S + S - (ptr) % S) % S) == 0)) -> id = ptr; ptr = (ptr + 1); printf("@@ sender Resend 1 (#%d)  base=%d top=%d\n", id, base, top); send_data(1, id); id = 0 }
  :: atomic { top < N && ((ptr == top) && ((((2) % S + S - (top) % S) % S) == 0) && ((top - base) < W)) -> id = ptr; top = (top + 1); ptr = (ptr + 1); printf("@@ sender SendNew 2 (#%d)  base=%d top=%d\n", id, base, top); send_data(2, id); id = 0 }
  :: atomic { (((top - ptr) >= 1) && ((((2) % S + S - (ptr) % S) % S) == 0)) -> id = ptr; ptr = (ptr + 1); printf("@@ sender Resend 2 (#%d)  base=%d top=%d\n", id, base, top); send_data(2, id); id = 0 }
  :: atomic { top < N && ((ptr == top) && ((((3) % S + S - (top) % S) % S) == 0) && ((top - base) < W)) -> id = ptr; top = (top + 1); ptr = (ptr + 1); printf("@@ sender SendNew 3 (#%d)  base=%d top=%d\n", id, base, top); send_data(3, id); id = 0 }
  :: atomic { (((top - ptr) >= 1) && ((((3) % S + S - (ptr) % S) % S) == 0)) -> id = ptr; ptr = (ptr + 1); printf("@@ sender Resend 3 (#%d)  base=%d top=%d\n", id, base, top); send_data(3, id); id = 0 }
  :: atomic { top < N && ((ptr == top) && ((((4) % S + S - (top) % S) % S) == 0) && ((top - base) < W)) -> id = ptr; top = (top + 1); ptr = (ptr + 1); printf("@@ sender SendNew 4 (#%d)  base=%d top=%d\n", id, base, top); send_data(4, id); id = 0 }
  :: atomic { (((top - ptr) >= 1) && ((((4) % S + S - (ptr) % S) % S) == 0)) -> id = ptr; ptr = (ptr + 1); printf("@@ sender Resend 4 (#%d)  base=%d top=%d\n", id, base, top); send_data(4, id); id = 0 }
  :: acks?k,v ->
     atomic {
       if
       :: k == 0 && ((((v) % S + S - (base) % S) % S) <= (top - base)) -> base = (base + (((v) % S + S - (base) % S) % S)); ptr = (ptr > base -> ptr : base); printf("@@ sender AckIn %d  base=%d ptr=%d\n", v, base, ptr)
       :: k == 1 && ((((v) % S + S - (base) % S) % S) <= (top - base)) -> base = (base + (((v) % S + S - (base) % S) % S)); ptr = (ptr > base -> ptr : base); printf("@@ sender NakIn %d  base=%d ptr=%d\n", v, base, ptr);
          if :: ((((v) % S + S - (base) % S) % S) < (ptr - base)) -> printf("@@ sender Repair %d (#%d)  base=%d\n", v, base, base); send_data(v, base) :: else -> skip fi
       :: else -> printf("@@ sender ignores stale %d\n", v)
       fi;
       k = 0; v = 0
     }
  :: atomic { reordered < REORD && len(acks) >= 2 -> swap_head(acks); printf("@@   acks reordered\n") }
  :: atomic { timeout && ((top - base) >= 1) ->
       if :: gap_seen && data_drops <= 1 && ack_drops == 0 -> stall_with_gap = true :: else -> skip fi;
       printf("@@ sender Timeout (all quiet)  base=%d\n", base);
       if :: (((((base % S)) % S + S - (base) % S) % S) < (ptr - base)) -> printf("@@ sender Repair %d (#%d)  base=%d\n", (base % S), base, base); send_data((base % S), base) :: else -> skip fi }
  :: atomic { early < EARLY && ((top - base) >= 1) -> early++; printf("@@ sender Timeout (early)  base=%d\n", base);
       if :: (((((base % S)) % S + S - (base) % S) % S) < (ptr - base)) -> printf("@@ sender Repair %d (#%d)  base=%d\n", (base % S), base, base); send_data((base % S), base) :: else -> skip fi }
  od
}

proctype receiver() {
  byte f, id, k, v, n, a1, b1, a2, b2;
end:
  do
  :: data?f,id ->
     atomic {
     if
     :: (((((f) % S + S - (exp) % S) % S) == 0) && (since < W)) ->
        if :: id != exp -> misdelivered = true :: else -> skip fi; exp = (exp + 1); since = (since + 1); gap_seen = 0; nak_sent = 0; unacked++;
        printf("@@ receiver Accept %d (#%d)  exp=%d\n", f, id, exp);
        do
        :: held[exp % S] != 0 && ((((((exp % S)) % S + S - (exp) % S) % S) == 0) && (since < W)) ->
           f = exp % S; id = held[f] - 1; held[f] = 0;
           if :: id != exp -> misdelivered = true :: else -> skip fi; exp = (exp + 1); since = (since + 1); gap_seen = 0; nak_sent = 0; unacked++;
           printf("@@ receiver Accept %d (#%d, held)  exp=%d\n", f, id, exp)
        :: else -> break
        od;
        if
        :: unacked >= G || held[0] != 0 || held[1] != 0 || held[2] != 0 || held[3] != 0 || held[4] != 0 ->
           if
           :: ((((0) % S + S - (exp) % S) % S) == 0) -> since = 0; printf("@@ receiver AckOut 0  exp=%d since=%d\n", exp, since); parked = 0; parked_v = 0; unacked = 0; send_ack(0, 0)
           :: ((((1) % S + S - (exp) % S) % S) == 0) -> since = 0; printf("@@ receiver AckOut 1  exp=%d since=%d\n", exp, since); parked = 0; parked_v = 0; unacked = 0; send_ack(0, 1)
           :: ((((2) % S + S - (exp) % S) % S) == 0) -> since = 0; printf("@@ receiver AckOut 2  exp=%d since=%d\n", exp, since); parked = 0; parked_v = 0; unacked = 0; send_ack(0, 2)
           :: ((((3) % S + S - (exp) % S) % S) == 0) -> since = 0; printf("@@ receiver AckOut 3  exp=%d since=%d\n", exp, since); parked = 0; parked_v = 0; unacked = 0; send_ack(0, 3)
           :: ((((4) % S + S - (exp) % S) % S) == 0) -> since = 0; printf("@@ receiver AckOut 4  exp=%d since=%d\n", exp, since); parked = 0; parked_v = 0; unacked = 0; send_ack(0, 4)
           fi
        :: else ->
           if
           :: id % FPM == FPM - 1 ->
              if
              :: ((((0) % S + S - (exp) % S) % S) == 0) -> since = 0; printf("@@ receiver AckOut 0  exp=%d since=%d\n", exp, since); parked = 0; parked_v = 0; unacked = 0; send_ack(0, 0)
              :: ((((1) % S + S - (exp) % S) % S) == 0) -> since = 0; printf("@@ receiver AckOut 1  exp=%d since=%d\n", exp, since); parked = 0; parked_v = 0; unacked = 0; send_ack(0, 1)
              :: ((((2) % S + S - (exp) % S) % S) == 0) -> since = 0; printf("@@ receiver AckOut 2  exp=%d since=%d\n", exp, since); parked = 0; parked_v = 0; unacked = 0; send_ack(0, 2)
              :: ((((3) % S + S - (exp) % S) % S) == 0) -> since = 0; printf("@@ receiver AckOut 3  exp=%d since=%d\n", exp, since); parked = 0; parked_v = 0; unacked = 0; send_ack(0, 3)
              :: ((((4) % S + S - (exp) % S) % S) == 0) -> since = 0; printf("@@ receiver AckOut 4  exp=%d since=%d\n", exp, since); parked = 0; parked_v = 0; unacked = 0; send_ack(0, 4)
              :: ((((0) % S + S - (exp) % S) % S) == 0) -> since = 0; printf("@@ receiver AckDelayed 0  exp=%d since=%d\n", exp, since); parked = 1; parked_v = 0
              :: ((((1) % S + S - (exp) % S) % S) == 0) -> since = 0; printf("@@ receiver AckDelayed 1  exp=%d since=%d\n", exp, since); parked = 1; parked_v = 1
              :: ((((2) % S + S - (exp) % S) % S) == 0) -> since = 0; printf("@@ receiver AckDelayed 2  exp=%d since=%d\n", exp, since); parked = 1; parked_v = 2
              :: ((((3) % S + S - (exp) % S) % S) == 0) -> since = 0; printf("@@ receiver AckDelayed 3  exp=%d since=%d\n", exp, since); parked = 1; parked_v = 3
              :: ((((4) % S + S - (exp) % S) % S) == 0) -> since = 0; printf("@@ receiver AckDelayed 4  exp=%d since=%d\n", exp, since); parked = 1; parked_v = 4
              fi
           :: else -> skip
           fi
        fi
     :: unmatched < UNM && id % FPM == 0 && ((((f) % S + S - (exp) % S) % S) == 0) ->
        unmatched++; data_drops++; printf("@@ receiver Unmatched %d (#%d): no posted receive\n", f, id)
     :: ((((f) % S + S - (exp) % S) % S) >= W) -> printf("@@ receiver Duplicate %d (#%d)\n", f, id);
        if
        :: ((((0) % S + S - (exp) % S) % S) == 0) -> since = 0; printf("@@ receiver AckOut 0  exp=%d since=%d\n", exp, since); parked = 0; parked_v = 0; unacked = 0; send_ack(0, 0)
        :: ((((1) % S + S - (exp) % S) % S) == 0) -> since = 0; printf("@@ receiver AckOut 1  exp=%d since=%d\n", exp, since); parked = 0; parked_v = 0; unacked = 0; send_ack(0, 1)
        :: ((((2) % S + S - (exp) % S) % S) == 0) -> since = 0; printf("@@ receiver AckOut 2  exp=%d since=%d\n", exp, since); parked = 0; parked_v = 0; unacked = 0; send_ack(0, 2)
        :: ((((3) % S + S - (exp) % S) % S) == 0) -> since = 0; printf("@@ receiver AckOut 3  exp=%d since=%d\n", exp, since); parked = 0; parked_v = 0; unacked = 0; send_ack(0, 3)
        :: ((((4) % S + S - (exp) % S) % S) == 0) -> since = 0; printf("@@ receiver AckOut 4  exp=%d since=%d\n", exp, since); parked = 0; parked_v = 0; unacked = 0; send_ack(0, 4)
        fi
     :: held[f] == 0 && (((((f) % S + S - (exp) % S) % S) >= 1) && ((((f) % S + S - (exp) % S) % S) < W)) -> gap_seen = 1; held[f] = id + 1; printf("@@ receiver Hold %d (#%d)\n", f, id);
        if
        :: (((((0) % S + S - (exp) % S) % S) == 0) && (gap_seen == 1) && (nak_sent == 0)) -> nak_sent = 1; since = 0; printf("@@ receiver NakOut 0  exp=%d since=%d\n", exp, since); parked = 0; parked_v = 0; unacked = 0; send_ack(1, 0)
        :: (((((1) % S + S - (exp) % S) % S) == 0) && (gap_seen == 1) && (nak_sent == 0)) -> nak_sent = 1; since = 0; printf("@@ receiver NakOut 1  exp=%d since=%d\n", exp, since); parked = 0; parked_v = 0; unacked = 0; send_ack(1, 1)
        :: (((((2) % S + S - (exp) % S) % S) == 0) && (gap_seen == 1) && (nak_sent == 0)) -> nak_sent = 1; since = 0; printf("@@ receiver NakOut 2  exp=%d since=%d\n", exp, since); parked = 0; parked_v = 0; unacked = 0; send_ack(1, 2)
        :: (((((3) % S + S - (exp) % S) % S) == 0) && (gap_seen == 1) && (nak_sent == 0)) -> nak_sent = 1; since = 0; printf("@@ receiver NakOut 3  exp=%d since=%d\n", exp, since); parked = 0; parked_v = 0; unacked = 0; send_ack(1, 3)
        :: (((((4) % S + S - (exp) % S) % S) == 0) && (gap_seen == 1) && (nak_sent == 0)) -> nak_sent = 1; since = 0; printf("@@ receiver NakOut 4  exp=%d since=%d\n", exp, since); parked = 0; parked_v = 0; unacked = 0; send_ack(1, 4)
        :: else -> skip
        fi
     :: held[f] != 0 && (((((f) % S + S - (exp) % S) % S) >= 1) && ((((f) % S + S - (exp) % S) % S) < W)) -> gap_seen = 1; printf("@@ receiver Gap %d (#%d): held already\n", f, id);
        if
        :: ((((0) % S + S - (exp) % S) % S) == 0) -> since = 0; printf("@@ receiver AckOut 0  exp=%d since=%d\n", exp, since); parked = 0; parked_v = 0; unacked = 0; send_ack(0, 0)
        :: ((((1) % S + S - (exp) % S) % S) == 0) -> since = 0; printf("@@ receiver AckOut 1  exp=%d since=%d\n", exp, since); parked = 0; parked_v = 0; unacked = 0; send_ack(0, 1)
        :: ((((2) % S + S - (exp) % S) % S) == 0) -> since = 0; printf("@@ receiver AckOut 2  exp=%d since=%d\n", exp, since); parked = 0; parked_v = 0; unacked = 0; send_ack(0, 2)
        :: ((((3) % S + S - (exp) % S) % S) == 0) -> since = 0; printf("@@ receiver AckOut 3  exp=%d since=%d\n", exp, since); parked = 0; parked_v = 0; unacked = 0; send_ack(0, 3)
        :: ((((4) % S + S - (exp) % S) % S) == 0) -> since = 0; printf("@@ receiver AckOut 4  exp=%d since=%d\n", exp, since); parked = 0; parked_v = 0; unacked = 0; send_ack(0, 4)
        fi
     fi;
     f = 0; id = 0
     }
  :: atomic { parked -> printf("@@ receiver parked ack %d leaves\n", parked_v); send_ack(0, parked_v); parked = 0; parked_v = 0 }
  :: atomic { reordered < REORD && len(data) >= 2 -> swap_head(data); printf("@@   frames reordered\n") }
  od
}

init {
  atomic { run sender(); run receiver() }
}

/* every accepted frame is the flow's next one: each delivered once, in order */
ltl in_order_once { [] !misdelivered }
/* the sender releases only frames the receiver has accepted */
ltl released_after_accept { [] (base <= exp) }
/* the table's invariants hold in every state */
ltl table_invariants_hold { [] table_invariants }
/* with one frame dropped and no acknowledgment lost, a gap is repaired by a NAK, not the timer */
ltl gap_repaired_by_nak { [] !stall_with_gap }
/* every frame is eventually accepted and acknowledged (-a -f) */
ltl all_delivered { <> (exp == N && base == N) }

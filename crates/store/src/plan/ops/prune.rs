//! Which entities past their retention a round of pruning removes. An entity goes only when
//! nothing can still need it: it holds no lease, no work and no queued event, and every
//! entity linked to it (its predecessors and successors) has ended too — a live parent's
//! subscriptions count its successors, and a live child reports to its predecessors, so a
//! link to a live entity keeps both ends. Nor does an entity go while it holds the newest
//! row of a table whose ids the store would hand out again (SQLite gives a new row the
//! largest id plus one: removing the newest would let a later row take its id, and a
//! reader going on from the last id it saw miss it); it goes once something newer exists.

use crate::Millis;

/// An entity in an end state past its retention, as read with what could keep it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub(crate) id: i64,
    pub(crate) machine: String,
    pub(crate) key: String,
    pub(crate) state: String,
    pub(crate) ended_at: Millis,
    /// An engine holds it.
    pub(crate) leased: bool,
    /// Its auto action or agent task is pending.
    pub(crate) busy: bool,
    /// Events wait in its inbox.
    pub(crate) queued: bool,
    /// A predecessor or successor has not ended.
    pub(crate) live_link: bool,
    /// It holds the newest row of a table whose ids would be handed out again (SQLite).
    pub(crate) newest: bool,
}

impl Candidate {
    /// Whether nothing keeps the entity any more.
    pub(crate) fn removable(&self) -> bool {
        !(self.leased || self.busy || self.queued || self.live_link || self.newest)
    }
}

/// What a round decides over the pages it read, one per rule in order.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Choice {
    /// The ids of the entities to remove, at most `limit`, in the order looked at.
    pub(crate) remove: Vec<i64>,
    /// How many past their retention were looked at and kept.
    pub(crate) kept: u64,
    /// Per rule: where the next round goes on (`None`: from the start).
    pub(crate) next: Vec<Option<(Millis, i64)>>,
    /// More may be past retention than this round looked at.
    pub(crate) more: bool,
}

/// Chooses, over `pages` (per rule, the candidates read after the rule's cursor `after`,
/// in `(ended_at, id)` order, each page at most `page` long), up to `limit` removable
/// entities, and each rule's cursor. A full page means more may follow it; a round that
/// stops at its limit goes on next time after the last candidate it looked at; a rule
/// whose page was not full starts over next time (the entities it kept may be free then).
pub(crate) fn choose(pages: &[Vec<Candidate>], after: &[Option<(Millis, i64)>], page: usize, limit: usize) -> Choice {
    let mut c = Choice::default();
    for (rule, candidates) in pages.iter().enumerate() {
        let mut cursor = after.get(rule).copied().flatten();
        let mut stopped = false;
        for cand in candidates {
            if c.remove.len() == limit {
                stopped = true;
                break;
            }
            if cand.removable() {
                c.remove.push(cand.id);
            } else {
                c.kept += 1;
            }
            cursor = Some((cand.ended_at, cand.id));
        }
        let goes_on = stopped || candidates.len() >= page;
        c.more |= goes_on;
        c.next.push(if goes_on { cursor } else { None });
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(id: i64, ended_at: Millis) -> Candidate {
        Candidate {
            id,
            machine: "app".into(),
            key: format!("k{id}"),
            state: "deleted".into(),
            ended_at,
            leased: false,
            busy: false,
            queued: false,
            live_link: false,
            newest: false,
        }
    }

    #[test]
    fn an_entity_goes_only_when_nothing_keeps_it() {
        assert!(cand(1, 0).removable());
        for keep in [
            Candidate { leased: true, ..cand(1, 0) },
            Candidate { busy: true, ..cand(1, 0) },
            Candidate { queued: true, ..cand(1, 0) },
            Candidate { live_link: true, ..cand(1, 0) },
            Candidate { newest: true, ..cand(1, 0) },
        ] {
            assert!(!keep.removable(), "{keep:?}");
        }
    }

    #[test]
    fn a_round_takes_up_to_its_limit_and_says_where_each_rule_goes_on() {
        let linked = |c: Candidate| Candidate { live_link: true, ..c };
        // Rule 0: a full page (3) with one kept; rule 1: a short page.
        let pages = vec![vec![cand(1, 10), linked(cand(2, 11)), cand(3, 12)], vec![cand(7, 5)]];
        let all = choose(&pages, &[None, None], 3, 10);
        assert_eq!(all.remove, [1, 3, 7]);
        assert_eq!(all.kept, 1);
        assert_eq!(all.next, [Some((12, 3)), None], "a full page goes on after its last, a short one starts over");
        assert!(all.more);
        // A limit of 1 stops within rule 0: it goes on after what it looked at, and rule
        // 1 keeps its cursor.
        let one = choose(&pages, &[None, Some((4, 6))], 3, 1);
        assert_eq!(one.remove, [1]);
        assert_eq!(one.next, [Some((10, 1)), Some((4, 6))]);
        assert!(one.more);
        // Nothing full, nothing stopped: done.
        let short = choose(&[vec![linked(cand(1, 1))]], &[None], 3, 10);
        assert_eq!((short.remove.len(), short.kept, short.more), (0, 1, false));
        assert_eq!(short.next, [None]);
    }
}

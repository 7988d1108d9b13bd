//! The history checker: what clients saw, against what the resource kept.
//!
//! Workers record every operation as invoked, then ok, failed or unknown
//! (a timeout or reset after sending: it may have happened). The resource's
//! own durable state supplies the accepted writes in commit order. The
//! checker reports, per resource, the four ways a fence can fail:
//! stale overwrites, operations applied twice, acknowledged publications that
//! are missing, and a publication pointer that moved backwards.

use std::collections::{BTreeMap, HashMap, HashSet};

/// What a worker heard back about one operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Acknowledged: it happened.
    Ok,
    /// Refused: it did not happen.
    Failed,
    /// The client cannot know: it may or may not have happened.
    Unknown,
}

/// One operation as a worker saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    /// The fenced resource.
    pub resource: String,
    /// The operation id.
    pub operation: String,
    /// The token the worker presented.
    pub token: i64,
    /// What the worker heard.
    pub status: Status,
}

/// One write the resource accepted, in commit order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Accepted {
    /// The fenced resource.
    pub resource: String,
    /// The operation id.
    pub operation: String,
    /// The token the write carried.
    pub token: i64,
}

/// Every violation the checker found; empty lists mean a clean run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Accepted writes whose token was below (or, with one write per
    /// generation, equal to) one accepted before them.
    pub stale_overwrites: Vec<Accepted>,
    /// Operation ids accepted more than once.
    pub doubled_operations: Vec<String>,
    /// Operations acknowledged as ok that the resource does not have.
    pub lost_publications: Vec<Observed>,
    /// Resources whose final pointer is not the highest accepted token.
    pub pointer_regressions: Vec<String>,
}

impl Verdict {
    /// No violation of any kind.
    pub fn is_clean(&self) -> bool {
        self.stale_overwrites.is_empty()
            && self.doubled_operations.is_empty()
            && self.lost_publications.is_empty()
            && self.pointer_regressions.is_empty()
    }
}

/// Which writes per generation the resource may accept, as the fence kit's
/// policy says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PerGeneration {
    /// One write per generation: an equal token after an accepted one is a
    /// violation too.
    One,
    /// Several writes with the same token are allowed (ordered or session).
    Several,
}

/// Checks `observed` against the resource's `accepted` log (commit order) and
/// its final `pointers` (resource to token).
pub fn check(
    observed: &[Observed],
    accepted: &[Accepted],
    pointers: &BTreeMap<String, i64>,
    per_generation: PerGeneration,
) -> Verdict {
    let strict = per_generation == PerGeneration::One;
    let mut verdict = Verdict::default();
    let mut highest: HashMap<&str, i64> = HashMap::new();
    let mut seen_ops: HashSet<(&str, &str)> = HashSet::new();
    for a in accepted {
        if let Some(&h) = highest.get(a.resource.as_str()) {
            if a.token < h || (strict && a.token == h) {
                verdict.stale_overwrites.push(a.clone());
            }
        }
        let h = highest.entry(a.resource.as_str()).or_insert(a.token);
        *h = (*h).max(a.token);
        if !seen_ops.insert((a.resource.as_str(), a.operation.as_str())) {
            verdict.doubled_operations.push(a.operation.clone());
        }
    }
    for o in observed.iter().filter(|o| o.status == Status::Ok) {
        if !seen_ops.contains(&(o.resource.as_str(), o.operation.as_str())) {
            verdict.lost_publications.push(o.clone());
        }
    }
    for (resource, token) in pointers {
        if highest.get(resource.as_str()).is_some_and(|h| h != token) {
            verdict.pointer_regressions.push(resource.clone());
        }
    }
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acc(r: &str, op: &str, t: i64) -> Accepted {
        Accepted {
            resource: r.into(),
            operation: op.into(),
            token: t,
        }
    }

    fn obs(r: &str, op: &str, t: i64, status: Status) -> Observed {
        Observed {
            resource: r.into(),
            operation: op.into(),
            token: t,
            status,
        }
    }

    #[test]
    fn a_clean_history_is_clean() {
        let accepted = [acc("a", "o1", 1), acc("a", "o2", 3), acc("b", "o3", 2)];
        let observed = [
            obs("a", "o1", 1, Status::Ok),
            obs("a", "o9", 2, Status::Unknown),
            obs("a", "o2", 3, Status::Ok),
        ];
        let pointers = BTreeMap::from([("a".to_string(), 3), ("b".to_string(), 2)]);
        assert!(check(&observed, &accepted, &pointers, PerGeneration::One).is_clean());
    }

    #[test]
    fn each_violation_is_reported() {
        let accepted = [
            acc("a", "o1", 5),
            acc("a", "o2", 4),
            acc("a", "o1", 6),
            acc("a", "o3", 6),
        ];
        let observed = [
            obs("a", "lost", 7, Status::Ok),
            obs("a", "maybe", 8, Status::Unknown),
            obs("a", "no", 9, Status::Failed),
        ];
        let pointers = BTreeMap::from([("a".to_string(), 4)]);
        let v = check(&observed, &accepted, &pointers, PerGeneration::One);
        assert_eq!(
            v.stale_overwrites,
            vec![acc("a", "o2", 4), acc("a", "o3", 6)]
        );
        assert_eq!(v.doubled_operations, vec!["o1".to_string()]);
        assert_eq!(v.lost_publications, vec![obs("a", "lost", 7, Status::Ok)]);
        assert_eq!(v.pointer_regressions, vec!["a".to_string()]);
        let session = check(
            &[],
            &[acc("s", "x", 2), acc("s", "y", 2)],
            &BTreeMap::new(),
            PerGeneration::Several,
        );
        assert!(
            session.stale_overwrites.is_empty(),
            "equal tokens pass the session rule"
        );
        let strict = check(
            &[],
            &[acc("s", "x", 2), acc("s", "y", 2)],
            &BTreeMap::new(),
            PerGeneration::One,
        );
        assert_eq!(
            strict.stale_overwrites.len(),
            1,
            "but not one write per generation"
        );
    }
}

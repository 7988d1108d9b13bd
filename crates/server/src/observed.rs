//! What the operator page and the readiness probe read beside the
//! metrics (which are counters, gauges and histograms only): the recent
//! holder changes ([`History`]), the page's headline series, one point per
//! second ([`Figures`]), and whether the server grants (`/readyz`). One per
//! server, shared by its engines, its cluster seat and its HTTP port.

use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

use crate::history::History;
use crate::metrics::{Figures, Metrics, Totals};

/// Points the page's series keeps: two minutes at one a second.
pub const FIGURES_LEN: usize = 120;

/// The page's state and the readiness flag.
pub(crate) struct Observed {
    /// Recent holder changes per resource, for the operator page.
    pub(crate) history: History,
    /// The page's headline series, newest last.
    series: Mutex<VecDeque<Figures>>,
    /// True once recovery is done and the server grants (`/readyz`).
    pub(crate) ready: AtomicBool,
}

impl Default for Observed {
    fn default() -> Self {
        Self {
            history: History::default(),
            series: Mutex::new(VecDeque::with_capacity(FIGURES_LEN)),
            ready: AtomicBool::new(false),
        }
    }
}

impl Observed {
    /// Adds one point to the page's series: what `metrics` counted between
    /// `before` and now, over `elapsed_ms`. Returns the new totals.
    pub(crate) fn sample(&self, metrics: &Metrics, before: &Totals, elapsed_ms: u64) -> Totals {
        let now = metrics.totals();
        let point = Figures::between(before, &now, elapsed_ms.max(1));
        let mut series = self.series.lock().unwrap_or_else(|p| p.into_inner());
        if series.len() == FIGURES_LEN {
            series.pop_front();
        }
        series.push_back(point);
        now
    }

    /// The page's series, oldest first.
    pub(crate) fn figures(&self) -> Vec<Figures> {
        let series = self.series.lock().unwrap_or_else(|p| p.into_inner());
        series.iter().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_gives_rates_and_the_p99_bucket_of_its_interval() {
        let m = Metrics::default();
        let o = Observed::default();
        let before = m.totals();
        for _ in 0..10 {
            m.grants.inc();
        }
        for _ in 0..98 {
            m.observe_commit_latency_us(80);
        }
        m.observe_commit_latency_us(3_000);
        m.observe_commit_latency_us(3_000);
        let after = o.sample(&m, &before, 2_000);
        let f = o.figures();
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].grants_per_s, 5.0);
        assert_eq!(f[0].commit_p99_ms, Some(5.0), "2 of 100 above 2 ms");
        assert_eq!(f[0].acquire_p99_ms, None, "no acquire observed");
        o.sample(&m, &after, 1_000);
        assert_eq!(
            o.figures()[1].grants_per_s,
            0.0,
            "the next interval is its own"
        );
        assert_eq!(o.figures()[1].commit_p99_ms, None);
    }
}

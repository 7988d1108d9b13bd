//! The quota file (`--quota-file`): what each tenant's name prefix may
//! hold, wait for, watch and ask per second, and how many sessions a
//! principal may keep open. Read at start and on every SIGHUP (a file that
//! breaks a rule leaves the one in force, as the auth file does).
//!
//! The table counts leases, waiters and sessions itself (`baton_core`'s
//! `table/quotas.rs`): the engine hands it the rules in force before its
//! next step whenever they change (`generation`). Rates and watches are
//! counted here, at the service, before anything reaches the engine.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use baton_core::quota::{Bucket, OverQuota, PrefixQuota, QuotaKind, QuotaRules, Rate};
use tonic::Status;
use unicode_normalization::UnicodeNormalization;

/// Why a quota file was refused: the file, the line and the rule.
#[derive(Debug, thiserror::Error)]
#[error("quota file {path}: {message}")]
pub struct QuotaFileError {
    pub path: String,
    pub message: String,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    prefix: Vec<PrefixEntry>,
    #[serde(default)]
    principal: Vec<PrincipalEntry>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PrefixEntry {
    prefix: toml::Spanned<String>,
    leases: Option<u64>,
    waiters: Option<u64>,
    watches: Option<u64>,
    rate: Option<RateEntry>,
    rate_per_principal: Option<RateEntry>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RateEntry {
    per_s: u32,
    burst: Option<u32>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PrincipalEntry {
    name: toml::Spanned<String>,
    sessions: u64,
}

/// The rule of the quota file a text breaks, with its line where known.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BrokenRule(String);

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// Parses a quota file's text against the server's `--max-waiters`. Every
/// error names the line and the rule.
pub fn parse(text: &str, n_waiters_max: u64) -> Result<QuotaRules, BrokenRule> {
    let file: File = toml::from_str(text).map_err(|e| {
        let line = e.span().map(|s| line_of(text, s.start));
        let message = e.message().trim_end().to_owned();
        BrokenRule(match line {
            Some(line) => format!("line {line}: {message}"),
            None => message,
        })
    })?;
    let mut prefixes = Vec::with_capacity(file.prefix.len());
    let mut lines = HashMap::new();
    for e in file.prefix {
        let line = line_of(text, e.prefix.span().start);
        let raw = e.prefix.into_inner();
        if let Some(c) = raw.chars().find(|c| c.is_control()) {
            return Err(BrokenRule(format!(
                "line {line}: prefix {raw:?} holds the control character U+{:04X}; no name can start with it",
                c as u32
            )));
        }
        let rate = |r: Option<RateEntry>, key: &str| -> Result<Option<Rate>, BrokenRule> {
            let Some(r) = r else { return Ok(None) };
            if r.per_s == 0 {
                return Err(BrokenRule(format!("line {line}: `{key}.per_s` is 0; a rate is at least 1 request per second (set `leases` or `waiters` to 0 to close a prefix)")));
            }
            let burst = r.burst.unwrap_or(r.per_s);
            if burst == 0 {
                return Err(BrokenRule(format!("line {line}: `{key}.burst` is 0; a burst is at least 1 request (it defaults to per_s)")));
            }
            Ok(Some(Rate {
                per_s: r.per_s,
                burst,
            }))
        };
        let prefix: String = raw.nfc().collect();
        lines.insert(prefix.clone(), line);
        prefixes.push(PrefixQuota {
            prefix,
            leases_max: e.leases,
            waiters_max: e.waiters,
            watches_max: e.watches,
            rate: rate(e.rate, "rate")?,
            rate_per_principal: rate(e.rate_per_principal, "rate_per_principal")?,
        });
    }
    let mut principals = Vec::with_capacity(file.principal.len());
    for e in file.principal {
        let line = line_of(text, e.name.span().start);
        let name = e.name.into_inner();
        lines.insert(name.clone(), line);
        principals.push((name, e.sessions));
    }
    QuotaRules::new(prefixes, principals, n_waiters_max).map_err(|e| {
        use baton_core::quota::QuotaRuleError as E;
        let line = match &e {
            E::DuplicatePrefix(p) | E::DuplicatePrincipal(p) => lines.get(p).copied(),
            _ => None,
        };
        BrokenRule(match line {
            Some(line) => format!("line {line}: {e}"),
            None => e.to_string(),
        })
    })
}

fn read(path: &Path, n_waiters_max: u64) -> Result<QuotaRules, QuotaFileError> {
    let error = |message: String| QuotaFileError {
        path: path.display().to_string(),
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|e| error(e.to_string()))?;
    parse(&text, n_waiters_max).map_err(|e| error(e.0))
}

/// The quotas in force, what the service counts of them (rates, open
/// watches), and the refusals.
pub struct Quotas {
    path: Option<PathBuf>,
    n_waiters_max: u64,
    rules: RwLock<Arc<QuotaRules>>,
    /// Bumped by every reload that took: the engine re-applies the rules
    /// when it sees a new one.
    generation: AtomicU64,
    origin: Instant,
    /// Per prefix: its own bucket, and one per principal.
    buckets: Mutex<HashMap<String, PrefixBuckets>>,
    watches: Mutex<Watches>,
    /// Refusals per quota kind and scope, for metrics.
    refusals: Mutex<HashMap<(QuotaKind, String), u64>>,
}

/// A prefix's rate buckets: everyone's, and each principal's.
#[derive(Default)]
struct PrefixBuckets {
    everyone: Option<Bucket>,
    per_principal: HashMap<String, Bucket>,
}

/// The bucket of `prefix` (and of `principal`, for a per-principal rate),
/// full when first asked for; allocates only then.
fn bucket_of<'m>(
    buckets: &'m mut HashMap<String, PrefixBuckets>,
    prefix: &str,
    principal: Option<&str>,
    rate: Rate,
    now_ms: u64,
) -> &'m mut Bucket {
    if !buckets.contains_key(prefix) {
        buckets.insert(prefix.to_owned(), PrefixBuckets::default());
    }
    let of = buckets.get_mut(prefix).expect("inserted above");
    match principal {
        None => of
            .everyone
            .get_or_insert_with(|| Bucket::full(rate, now_ms)),
        Some(p) => {
            if !of.per_principal.contains_key(p) {
                of.per_principal
                    .insert(p.to_owned(), Bucket::full(rate, now_ms));
            }
            of.per_principal.get_mut(p).expect("inserted above")
        }
    }
}

/// Open watches: by their prefix (what a reload recounts from), and per
/// prefix quota.
#[derive(Default)]
struct Watches {
    by_prefix: HashMap<String, u64>,
    per_quota: Vec<u64>,
}

impl Default for Quotas {
    fn default() -> Self {
        Self::with_rules(None, 0, QuotaRules::default())
    }
}

impl Quotas {
    fn with_rules(path: Option<PathBuf>, n_waiters_max: u64, rules: QuotaRules) -> Self {
        let n = rules.prefixes().len();
        Self {
            path,
            n_waiters_max,
            rules: RwLock::new(Arc::new(rules)),
            generation: AtomicU64::new(0),
            origin: Instant::now(),
            buckets: Mutex::default(),
            watches: Mutex::new(Watches {
                by_prefix: HashMap::new(),
                per_quota: vec![0; n],
            }),
            refusals: Mutex::default(),
        }
    }

    /// No quota file: nothing is counted or refused.
    pub fn off() -> Self {
        Self::default()
    }

    /// Loads `path`; the error names the file, the line and the rule.
    pub fn load(path: &Path, n_waiters_max: u64) -> Result<Self, QuotaFileError> {
        let rules = read(path, n_waiters_max)?;
        Ok(Self::with_rules(
            Some(path.to_path_buf()),
            n_waiters_max,
            rules,
        ))
    }

    /// The file, if one was given.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Reads the file again; on error the rules in force stay. The number
    /// of prefix and principal quotas now in force.
    pub fn reload(&self) -> Result<(usize, usize), QuotaFileError> {
        let Some(path) = &self.path else {
            return Ok((0, 0));
        };
        let rules = read(path, self.n_waiters_max)?;
        let counts = (rules.prefixes().len(), rules.principals().count());
        {
            let mut watches = lock(&self.watches);
            let mut per_quota = vec![0; rules.prefixes().len()];
            for (prefix, n) in &watches.by_prefix {
                for (i, _) in rules.matching(prefix) {
                    per_quota[i] += n;
                }
            }
            watches.per_quota = per_quota;
            lock(&self.buckets).clear();
            *self.rules.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(rules);
        }
        self.generation.fetch_add(1, Ordering::Release);
        Ok(counts)
    }

    /// The rules in force.
    pub fn rules(&self) -> Arc<QuotaRules> {
        self.rules.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The reload count: the engine compares it with the one it applied.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Whether a quota file is in force (else every check is one branch).
    pub fn is_on(&self) -> bool {
        self.path.is_some()
    }

    /// Takes one request's token from the rate quotas of every prefix of
    /// `names`, or names the first that has none left (and takes none).
    /// `principal` is the caller's (`None` with auth off: one principal).
    pub fn take_rate<'a>(
        &self,
        names: impl Iterator<Item = &'a str>,
        principal: Option<&str>,
    ) -> Result<(), RateRefusal> {
        if !self.is_on() {
            return Ok(());
        }
        let rules = self.rules();
        let mut hit: Vec<&PrefixQuota> = Vec::new();
        for name in names {
            for (_, q) in rules.matching(name) {
                let rated = q.rate.is_some() || q.rate_per_principal.is_some();
                if rated && !hit.iter().any(|h| std::ptr::eq(*h, q)) {
                    hit.push(q);
                }
            }
        }
        if hit.is_empty() {
            return Ok(());
        }
        let who = principal.unwrap_or_default();
        let now_ms = self.origin.elapsed().as_millis() as u64;
        // Keyed by prefix and principal, not by a rule's place in the
        // file: a reload that races this call cannot mix two files' buckets.
        let mut buckets = lock(&self.buckets);
        let rated = |q: &PrefixQuota| {
            let everyone = q.rate.map(|r| (r, None, QuotaKind::Rate));
            let each = q
                .rate_per_principal
                .map(|r| (r, Some(who), QuotaKind::RatePerPrincipal));
            everyone.into_iter().chain(each)
        };
        for q in &hit {
            for (rate, principal, kind) in rated(q) {
                let bucket = bucket_of(&mut buckets, &q.prefix, principal, rate, now_ms);
                // A peek: take from a copy, so that a refusal takes nothing.
                if !bucket.clone().take(rate, now_ms) {
                    let wait_ms = bucket
                        .ms_until_token(rate, now_ms)
                        .min(RATE_REFUSAL_WAIT_MS_MAX);
                    drop(buckets);
                    return Err(RateRefusal {
                        status: self.refuse(OverQuota {
                            kind,
                            scope: q.prefix.clone(),
                            limit: u64::from(rate.per_s),
                        }),
                        wait: std::time::Duration::from_millis(wait_ms),
                    });
                }
            }
        }
        for q in &hit {
            for (rate, principal, _) in rated(q) {
                bucket_of(&mut buckets, &q.prefix, principal, rate, now_ms).take(rate, now_ms);
            }
        }
        Ok(())
    }

    /// Counts a watch of `prefix` open, if every watches quota over it has
    /// room: dropping the guard counts it closed.
    pub fn open_watch(self: &Arc<Self>, prefix: &str) -> Result<WatchGuard, Status> {
        if self.is_on() {
            let mut watches = lock(&self.watches);
            // Read under the lock a reload holds while it swaps the rules,
            // so that the indexes are those of `per_quota`.
            let rules = self.rules();
            for (i, q) in rules.matching(prefix) {
                if let Some(max) = q.watches_max {
                    if watches.per_quota[i] >= max {
                        drop(watches);
                        return Err(self.refuse(OverQuota {
                            kind: QuotaKind::Watches,
                            scope: q.prefix.clone(),
                            limit: max,
                        }));
                    }
                }
            }
            for (i, _) in rules.matching(prefix) {
                watches.per_quota[i] += 1;
            }
            *watches.by_prefix.entry(prefix.to_owned()).or_default() += 1;
        }
        Ok(WatchGuard {
            quotas: self.clone(),
            prefix: prefix.to_owned(),
        })
    }

    fn close_watch(&self, prefix: &str) {
        if !self.is_on() {
            return;
        }
        let mut watches = lock(&self.watches);
        let rules = self.rules();
        let Some(n) = watches.by_prefix.get_mut(prefix) else {
            return;
        };
        *n -= 1;
        if *n == 0 {
            watches.by_prefix.remove(prefix);
        }
        for (i, _) in rules.matching(prefix) {
            watches.per_quota[i] = watches.per_quota[i].saturating_sub(1);
        }
    }

    /// Open watches per prefix quota, in the rules' order.
    pub fn watch_use(&self) -> Vec<u64> {
        lock(&self.watches).per_quota.clone()
    }

    /// Counts a refusal and makes its answer: RESOURCE_EXHAUSTED naming
    /// the quota, its prefix and its limit.
    pub fn refuse(&self, over: OverQuota) -> Status {
        self.count_refusal(&over);
        Status::resource_exhausted(over.to_string())
    }

    /// Counts a refusal the table made (leases, waiters, sessions).
    pub fn count_refusal(&self, over: &OverQuota) {
        *lock(&self.refusals)
            .entry((over.kind, over.scope.clone()))
            .or_default() += 1;
    }

    /// Refusals so far, per quota kind and scope.
    pub fn refusals(&self) -> Vec<(QuotaKind, String, u64)> {
        let mut v: Vec<_> = lock(&self.refusals)
            .iter()
            .map(|((k, s), n)| (*k, s.clone(), *n))
            .collect();
        v.sort_by(|a, b| (a.0.key(), &a.1).cmp(&(b.0.key(), &b.1)));
        v
    }
}

/// The longest a rate refusal is held back.
pub const RATE_REFUSAL_WAIT_MS_MAX: u64 = 1_000;

/// A request over a rate quota: its answer, to be given once the bucket
/// holds a token again (at most [`RATE_REFUSAL_WAIT_MS_MAX`] later). A
/// caller that retries in a loop is so held to the rate, and a refusal
/// costs the server a timer, not the CPU its retries would; nobody else
/// waits.
pub struct RateRefusal {
    status: Status,
    wait: std::time::Duration,
}

impl RateRefusal {
    /// The refusal, after its wait.
    pub async fn answer(self) -> Status {
        tokio::time::sleep(self.wait).await;
        self.status
    }
}

/// An open watch, counted against its prefix's watches quotas until dropped.
pub struct WatchGuard {
    quotas: Arc<Quotas>,
    prefix: String,
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        self.quotas.close_watch(&self.prefix);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_sets_prefix_and_principal_quotas() {
        let rules = parse(
            r#"
[[prefix]]
prefix = "team-a:"
leases = 100
waiters = 10
watches = 5
rate = { per_s = 200, burst = 400 }
rate_per_principal = { per_s = 50 }

[[principal]]
name = "batch"
sessions = 20
"#,
            1000,
        )
        .unwrap();
        let q = &rules.prefixes()[0];
        assert_eq!(q.prefix, "team-a:");
        assert_eq!(
            (q.leases_max, q.waiters_max, q.watches_max),
            (Some(100), Some(10), Some(5))
        );
        assert_eq!(
            q.rate,
            Some(Rate {
                per_s: 200,
                burst: 400
            })
        );
        assert_eq!(
            q.rate_per_principal,
            Some(Rate {
                per_s: 50,
                burst: 50
            })
        );
        assert_eq!(rules.sessions_max("batch"), Some(20));
    }

    #[test]
    fn every_broken_rule_is_named_with_its_line() {
        let cases = [
            (
                "[[prefix]]\nprefix = \"a:\"\nlease = 1\n",
                "line 3",
                "unknown field `lease`",
            ),
            (
                "[[prefix]]\nprefix = \"a:\"\nleases = -1\n",
                "line 3",
                "invalid value",
            ),
            (
                "[[prefix]]\nprefix = \"a:\"\n[[prefix]]\nprefix = \"a:\"\n",
                "line 4",
                "two quotas",
            ),
            (
                "[[prefix]]\nprefix = \"a:\"\nrate = { per_s = 0 }\n",
                "line 2",
                "at least 1",
            ),
            (
                "[[prefix]]\nprefix = \"a\\u0007\"\n",
                "line 2",
                "control character",
            ),
            (
                "[[prefix]]\nprefix = \"a:\"\nwaiters = 11\n",
                "",
                "above --max-waiters 10",
            ),
            (
                "[[principal]]\nname = \"p\"\n",
                "line 1",
                "missing field `sessions`",
            ),
        ];
        for (text, line, rule) in cases {
            let err = parse(text, 10).unwrap_err().to_string();
            assert!(err.contains(line) && err.contains(rule), "{text:?}: {err}");
        }
    }

    #[test]
    fn a_rate_refusal_takes_nothing_and_names_the_quota() {
        let dir = baton_testkit::TempDir::new("quota");
        let path = dir.path().join("q.toml");
        std::fs::write(
            &path,
            "[[prefix]]\nprefix = \"a:\"\nrate = { per_s = 1, burst = 2 }\n[[prefix]]\nprefix = \"a:b:\"\nrate = { per_s = 1, burst = 1 }\n",
        )
        .unwrap();
        let q = Quotas::load(&path, 10).unwrap();
        assert!(q.take_rate(["a:b:1"].into_iter(), None).is_ok());
        let refusal = q.take_rate(["a:b:2"].into_iter(), None).err().unwrap();
        assert!(refusal.wait <= std::time::Duration::from_secs(1));
        let err = refusal.status;
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        assert!(
            err.message().contains("prefix \"a:b:\""),
            "{}",
            err.message()
        );
        // The refusal took nothing from "a:": one more fits there.
        assert!(q.take_rate(["a:x"].into_iter(), None).is_ok());
        assert!(q.take_rate(["a:y"].into_iter(), None).is_err());
        assert_eq!(q.refusals().len(), 2);
    }

    #[test]
    fn watches_count_until_their_guard_drops_and_a_reload_recounts_them() {
        let dir = baton_testkit::TempDir::new("quota");
        let path = dir.path().join("q.toml");
        std::fs::write(&path, "[[prefix]]\nprefix = \"a:\"\nwatches = 1\n").unwrap();
        let q = Arc::new(Quotas::load(&path, 10).unwrap());
        let first = q.open_watch("a:x:").unwrap();
        let err = q.open_watch("a:").err().unwrap();
        assert!(err.message().contains("watches quota of prefix \"a:\""));
        q.open_watch("b:").unwrap();
        std::fs::write(&path, "[[prefix]]\nprefix = \"a:x\"\nwatches = 2\n").unwrap();
        q.reload().unwrap();
        assert_eq!(q.watch_use(), [1]);
        drop(first);
        assert_eq!(q.watch_use(), [0]);
    }
}

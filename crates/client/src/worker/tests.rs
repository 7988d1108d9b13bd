//! Keeper and backoff tests on tokio's paused clock: no real sleeps, exact instants.

use super::*;
use std::collections::VecDeque;

const TTL: Duration = Duration::from_secs(30);
const MARGIN: Duration = Duration::from_millis(1_500); // 5% of 30 s

#[derive(Clone, Copy, Debug)]
enum Step {
    Ok,
    Delay(Duration),
    NotOwner,
    Fail,
    Hang,
}

struct Script {
    sent: Arc<Mutex<Vec<Instant>>>,
    steps: VecDeque<Step>,
}

impl Renewer for Script {
    async fn renew(
        &mut self,
        _resource: &str,
        _id: &AcquisitionId,
    ) -> Result<Renewal, ClientError> {
        self.sent.lock().unwrap().push(Instant::now());
        let renewed = Renewal::Renewed {
            token: token(),
            remaining: TTL,
            valid_until: Instant::now() + TTL,
        };
        match self.steps.pop_front().unwrap_or(Step::Ok) {
            Step::Ok => Ok(renewed),
            Step::Delay(d) => {
                tokio::time::sleep(d).await;
                Ok(renewed)
            }
            Step::NotOwner => Ok(Renewal::NotOwner),
            Step::Fail => Err(ClientError::Indeterminate("connection reset".into())),
            Step::Hang => std::future::pending().await,
        }
    }
}

fn token() -> FencingToken {
    FencingToken::from_u64((1 << 40) | 7).unwrap()
}

/// A lease whose acquire was sent at `sent_at`.
fn lease(sent_at: Instant) -> Lease {
    Lease {
        resource: "job".into(),
        acquisition_id: AcquisitionId::from_bytes([1; 16]),
        token: token(),
        ttl: TTL,
        valid_until: sent_at + TTL,
        slot: None,
    }
}

fn start(steps: &[Step]) -> (Keeper, Arc<Mutex<Vec<Instant>>>, Instant) {
    let sent = Arc::new(Mutex::new(Vec::new()));
    let script = Script {
        sent: sent.clone(),
        steps: steps.iter().copied().collect(),
    };
    let t0 = Instant::now();
    (
        Keeper::start(script, lease(t0), KeeperConfig::default()),
        sent,
        t0,
    )
}

/// Records when the keeper's cancellation fires and the safe deadline at that moment.
fn watch_cancel(keeper: &Keeper) -> JoinHandle<(Instant, Instant)> {
    let guard = keeper.guard();
    tokio::spawn(async move {
        guard.cancellation().cancelled().await;
        (Instant::now(), guard.safe_until())
    })
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

#[tokio::test(start_paused = true)]
async fn renews_every_third_of_the_ttl() {
    let (keeper, sent, t0) = start(&[]);
    tokio::time::sleep(secs(65.0)).await;
    let expected: Vec<Instant> = (1..=6).map(|i| t0 + secs(10.0 * i as f64)).collect();
    assert_eq!(*sent.lock().unwrap(), expected);
    assert_eq!(keeper.ownership(), Ownership::Held);
    assert_eq!(keeper.safe_until(), t0 + secs(60.0) + TTL - MARGIN);
}

#[tokio::test(start_paused = true)]
async fn the_deadline_counts_from_when_the_renewal_was_sent() {
    let (keeper, _, t0) = start(&[Step::Delay(secs(2.0))]);
    assert_eq!(
        keeper.safe_until(),
        t0 + TTL - MARGIN,
        "first deadline from the acquire's send time"
    );
    tokio::time::sleep(secs(13.0)).await;
    // Sent at 10 s, answered at 12 s: the deadline is 10 s + TTL - margin, not 12 s + ...
    assert_eq!(keeper.safe_until(), t0 + secs(10.0) + TTL - MARGIN);
}

#[tokio::test(start_paused = true)]
async fn failed_renewals_make_ownership_uncertain_then_lost_at_the_deadline() {
    let (mut keeper, sent, t0) = start(&[Step::Fail; 64]);
    let cancelled = watch_cancel(&keeper);
    assert_eq!(keeper.changed().await, Ownership::Uncertain);
    assert_eq!(Instant::now(), t0 + secs(10.0));
    assert!(!keeper.may_start_effect(), "no new effects while uncertain");
    assert_eq!(keeper.changed().await, Ownership::Lost);
    let (fired_at, deadline) = cancelled.await.unwrap();
    assert_eq!(
        fired_at,
        t0 + TTL - MARGIN,
        "cancelled exactly at the safe deadline"
    );
    assert_eq!(
        deadline,
        t0 + TTL - MARGIN,
        "failed renewals never extended it"
    );
    assert!(
        sent.lock().unwrap().len() > 2,
        "it kept retrying while uncertain"
    );
}

#[tokio::test(start_paused = true)]
async fn not_owner_is_lost_at_once() {
    let (keeper, _, t0) = start(&[Step::NotOwner]);
    let (fired_at, _) = watch_cancel(&keeper).await.unwrap();
    assert_eq!(fired_at, t0 + secs(10.0));
    assert_eq!(keeper.ownership(), Ownership::Lost);
}

#[tokio::test(start_paused = true)]
async fn a_renewal_that_never_answers_is_cut_off_at_the_deadline() {
    let (keeper, _, t0) = start(&[Step::Hang]);
    let (fired_at, _) = watch_cancel(&keeper).await.unwrap();
    assert_eq!(fired_at, t0 + TTL - MARGIN);
}

#[tokio::test(start_paused = true)]
async fn a_paused_process_finds_itself_lost_before_its_next_effect() {
    let (keeper, _, t0) = start(&[]);
    let guard = keeper.guard();
    assert!(guard.may_start_effect());
    // The process stops (SIGSTOP, a long GC): the renew task never runs again.
    let _lease = keeper.stop();
    tokio::time::advance(secs(29.0)).await;
    assert!(Instant::now() >= t0 + TTL - MARGIN);
    assert_eq!(
        guard.ownership(),
        Ownership::Lost,
        "read from the monotonic deadline, not the last state"
    );
    assert!(!guard.may_start_effect());
}

#[tokio::test(start_paused = true)]
async fn cancellation_never_fires_after_the_safe_deadline() {
    for seed in 1..=40u64 {
        let mut rng = Backoff::with_seed(Duration::from_secs(1), Duration::from_secs(1), seed);
        let steps: Vec<Step> = (0..12)
            .map(|_| match rng.next_delay().as_millis() % 6 {
                0 | 1 => Step::Ok,
                2 => Step::Fail,
                3 => Step::Delay(Duration::from_millis(
                    rng.next_delay().as_millis() as u64 * 20,
                )),
                4 => Step::Hang,
                _ => Step::NotOwner,
            })
            .collect();
        let (keeper, _, _) = start(&steps);
        let (fired_at, deadline) = tokio::time::timeout(secs(600.0), watch_cancel(&keeper))
            .await
            .unwrap_or_else(|_| panic!("seed {seed}: never lost with {steps:?}"))
            .unwrap();
        assert!(
            fired_at <= deadline,
            "seed {seed}: cancelled {:?} after the deadline",
            fired_at - deadline
        );
    }
}

#[test]
fn backoff_doubles_to_its_cap_with_full_jitter() {
    let mut b = Backoff::with_seed(Duration::from_millis(10), Duration::from_millis(100), 42);
    let ceilings: Vec<u128> = (0..6)
        .map(|_| {
            let c = b.ceiling();
            assert!(b.next_delay() <= c);
            c.as_millis()
        })
        .collect();
    assert_eq!(ceilings, [10, 20, 40, 80, 100, 100]);
    let draws: Vec<Duration> = (0..1_000).map(|_| b.next_delay()).collect();
    assert!(
        draws.iter().any(|d| *d < Duration::from_millis(10)),
        "full jitter reaches near zero"
    );
    assert!(
        draws.iter().any(|d| *d > Duration::from_millis(90)),
        "and near the cap"
    );
    let mut again = Backoff::with_seed(Duration::from_millis(10), Duration::from_millis(100), 42);
    let mut first = Backoff::with_seed(Duration::from_millis(10), Duration::from_millis(100), 42);
    assert_eq!(
        (0..20).map(|_| again.next_delay()).collect::<Vec<_>>(),
        (0..20).map(|_| first.next_delay()).collect::<Vec<_>>()
    );
    b.reset();
    assert_eq!(b.ceiling(), Duration::from_millis(10));
}

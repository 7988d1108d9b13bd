//! Known-bad variants: one-line mistakes a contributor could plausibly
//! make, compiled in only with the `known-bad` feature, so that the
//! simulator (`crates/sim`) can show it finds each of them.
//!
//! Without the feature, [`on`] is a constant `false` and every variant's
//! line folds away. With it, the variant is chosen per thread, so one
//! simulator process can run seeds of the correct build and of each
//! variant side by side.

/// One known-bad variant. Each names the line it changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    /// `Deadline::acknowledged` counts the TTL from the answer's arrival
    /// instead of the request's send time (`baton-client`).
    KeeperReceiveTime,
    /// Answers go out when their commit starts instead of when it is
    /// durable (`pipeline::batch`, which the server's committer and the
    /// simulator both run).
    AnswerBeforeDurable,
    /// The leader keeps answering past its leadership deadline
    /// (`election::Timing::answers`, `baton-store-pg`).
    LeaderPastDeadline,
    /// The fence rule refuses a cancelled token with `<` instead of `<=`
    /// (`rule::refusal`, `baton-fence`).
    CancelBelowOnly,
    /// A recovered lease is held from the restart without its full TTL
    /// (`LeaseTable::recover`).
    RecoveryWithoutTtl,
    /// A restore keeps the epoch it found instead of moving above it
    /// (`restore_epoch`).
    RestoreSameEpoch,
    /// A semaphore admits a permit while as many as N are held (`<=`
    /// instead of `<`, `LeaseTable::admits`).
    PermitsAtOrBelow,
    /// A shared lock admits an exclusive request while shared holders hold
    /// it (`LeaseTable::admits`).
    ExclusiveBesideShared,
    /// The fence kit accepts a write under a shared lease without judging
    /// it against the last exclusive write (`baton_fence`'s shared side).
    SharedWriteUnchecked,
}

impl Variant {
    /// Every variant, in a fixed order.
    pub const ALL: [Variant; 9] = [
        Variant::KeeperReceiveTime,
        Variant::AnswerBeforeDurable,
        Variant::LeaderPastDeadline,
        Variant::CancelBelowOnly,
        Variant::RecoveryWithoutTtl,
        Variant::RestoreSameEpoch,
        Variant::PermitsAtOrBelow,
        Variant::ExclusiveBesideShared,
        Variant::SharedWriteUnchecked,
    ];

    /// The variant's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Variant::KeeperReceiveTime => "keeper-receive-time",
            Variant::AnswerBeforeDurable => "answer-before-durable",
            Variant::LeaderPastDeadline => "leader-past-deadline",
            Variant::CancelBelowOnly => "cancel-below-only",
            Variant::RecoveryWithoutTtl => "recovery-without-ttl",
            Variant::RestoreSameEpoch => "restore-same-epoch",
            Variant::PermitsAtOrBelow => "permits-at-or-below",
            Variant::ExclusiveBesideShared => "exclusive-beside-shared",
            Variant::SharedWriteUnchecked => "shared-write-unchecked",
        }
    }

    /// The variant named `name`, if any.
    pub fn parse(name: &str) -> Option<Variant> {
        Variant::ALL.into_iter().find(|v| v.name() == name)
    }
}

#[cfg(feature = "known-bad")]
thread_local! {
    static ACTIVE: std::cell::Cell<Option<Variant>> = const { std::cell::Cell::new(None) };
}

/// Whether `variant` is in force on this thread (never, without the
/// `known-bad` feature).
#[inline]
pub fn on(variant: Variant) -> bool {
    #[cfg(feature = "known-bad")]
    {
        ACTIVE.with(|a| a.get() == Some(variant))
    }
    #[cfg(not(feature = "known-bad"))]
    {
        let _ = variant;
        false
    }
}

/// Puts `variant` in force on this thread (`None`: the correct build).
#[cfg(feature = "known-bad")]
pub fn set(variant: Option<Variant>) {
    ACTIVE.with(|a| a.set(variant));
}

/// Whether this build has the variants at all.
pub const COMPILED: bool = cfg!(feature = "known-bad");

use std::{fmt, num::NonZeroU64};

/// Bits of a token that count grants within one epoch.
pub const COUNTER_BITS: u32 = 40;
/// The largest counter value within one epoch.
pub const COUNTER_MAX: u64 = (1 << COUNTER_BITS) - 1;
/// The largest epoch: `EPOCH_MAX << COUNTER_BITS | COUNTER_MAX` is `i64::MAX`,
/// so every token fits a PostgreSQL `BIGINT`.
pub const EPOCH_MAX: u32 = (1 << (63 - COUNTER_BITS)) - 1;

/// A token epoch: every restore starts a new, higher one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Epoch(u32);

impl Epoch {
    /// The epoch of a new data directory.
    pub const FIRST: Epoch = Epoch(1);

    /// An epoch from 1 to `EPOCH_MAX`.
    pub fn new(value: u32) -> Result<Self, TokenError> {
        if value == 0 || value > EPOCH_MAX {
            return Err(TokenError::EpochOutOfRange {
                epoch: u64::from(value),
            });
        }
        Ok(Self(value))
    }

    /// The epoch as a number.
    pub fn get(self) -> u32 {
        self.0
    }

    /// The epoch after this one (a restore, or a counter that ran out).
    pub fn next(self) -> Result<Self, TokenError> {
        Self::new(self.0 + 1)
    }
}

/// An ordered generation number: `epoch << 40 | counter` when Baton issued
/// it, and always 1 to 2^63-1, so that it fits the `BIGINT` a resource
/// keeps it in. The one token type of the client, the fence kit and the
/// applications: a token goes from a grant to an SQL parameter without a
/// cast ([`FencingToken::bigint`]).
///
/// Compare tokens as plain integers. Every token the service issues is above
/// every token it issued before, on every resource, so per resource they
/// strictly increase.
///
/// Never 0 (every epoch is at least 1): an absent token (`Option`) costs
/// no space beside one, which the lease table counts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(NonZeroU64);

impl FencingToken {
    /// The largest token (2^63-1): cancelling "at" it blocks every token.
    pub const MAX: FencingToken = FencingToken(NonZeroU64::new(i64::MAX as u64).expect("not 0"));

    /// Any token from 1 to 2^63-1: Baton's, or another issuer's (an etcd
    /// revision, a sequence) where the fence kit enforces it. Its
    /// [`FencingToken::epoch`] means something only for Baton's tokens.
    pub fn of(token: u64) -> Result<Self, TokenError> {
        match NonZeroU64::new(token) {
            Some(value) if value <= Self::MAX.0 => Ok(Self(value)),
            _ => Err(TokenError::OutOfRange { token }),
        }
    }

    /// A token as a resource stored it (a `BIGINT` column).
    pub fn from_bigint(value: i64) -> Result<Self, TokenError> {
        u64::try_from(value)
            .map_err(|_| TokenError::NegativeBigint { value })
            .and_then(Self::of)
    }

    /// The token as a `BIGINT` (SQL parameters and columns): lossless,
    /// since a token is at most 2^63-1.
    pub fn bigint(self) -> i64 {
        i64::try_from(self.get()).expect("a token is at most i64::MAX")
    }

    /// The token `epoch << 40 | counter`.
    pub fn new(epoch: Epoch, counter: u64) -> Result<Self, TokenError> {
        if counter > COUNTER_MAX {
            return Err(TokenError::CounterOutOfRange { counter });
        }
        let value = (u64::from(epoch.0) << COUNTER_BITS) | counter;
        Ok(Self(
            NonZeroU64::new(value).expect("an epoch is at least 1"),
        ))
    }

    /// Accepts any value that fits a `BIGINT` and names a valid epoch.
    pub fn from_u64(value: u64) -> Result<Self, TokenError> {
        if value > i64::MAX as u64 {
            return Err(TokenError::AboveBigint { token: value });
        }
        let epoch = Epoch::new((value >> COUNTER_BITS) as u32)?;
        Self::new(epoch, value & COUNTER_MAX)
    }

    /// The token as an integer: compare tokens as plain integers.
    pub fn get(self) -> u64 {
        self.0.get()
    }

    fn epoch_value(self) -> u32 {
        (self.get() >> COUNTER_BITS) as u32
    }

    /// The epoch part.
    pub fn epoch(self) -> Epoch {
        Epoch(self.epoch_value())
    }

    /// The counter part.
    pub fn counter(self) -> u64 {
        self.get() & COUNTER_MAX
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A token or epoch out of range, or a clock a restore refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
#[allow(missing_docs)] // variants carry their message; fields are named for the value and the rule
pub enum TokenError {
    #[error("epoch {epoch} is out of range: epochs run from 1 to {EPOCH_MAX}")]
    EpochOutOfRange { epoch: u64 },
    #[error("token counter {counter} is above the per-epoch maximum {COUNTER_MAX}")]
    CounterOutOfRange { counter: u64 },
    #[error("token {token} does not fit a signed 64-bit integer (BIGINT)")]
    AboveBigint { token: u64 },
    #[error("token {token} is out of range: tokens are 1 to 9223372036854775807 (a BIGINT)")]
    OutOfRange { token: u64 },
    #[error("a stored token is {value}: tokens are 1 to 9223372036854775807")]
    NegativeBigint { value: i64 },
    #[error("the wall clock reads {now_unix_s} s since 1970, later than {latest_unix_s}: fix the clock before a restore (its epoch floor would use up the epoch space)")]
    ClockImplausible { now_unix_s: u64, latest_unix_s: u64 },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_issuers_token_fits_a_bigint_both_ways() {
        for t in [1, 108, 1 << 40, i64::MAX as u64] {
            let token = FencingToken::of(t).unwrap();
            assert_eq!(token.get(), t);
            assert_eq!(FencingToken::from_bigint(token.bigint()), Ok(token));
        }
        assert_eq!(
            FencingToken::of(0),
            Err(TokenError::OutOfRange { token: 0 })
        );
        assert_eq!(
            FencingToken::of(1 << 63),
            Err(TokenError::OutOfRange { token: 1 << 63 })
        );
        assert_eq!(
            FencingToken::from_bigint(-1),
            Err(TokenError::NegativeBigint { value: -1 })
        );
        assert_eq!(FencingToken::MAX.bigint(), i64::MAX);
    }

    #[test]
    fn tokens_order_by_epoch_then_counter_and_fit_bigint() {
        let e1 = Epoch::FIRST;
        let e2 = e1.next().unwrap();
        let high = FencingToken::new(e1, COUNTER_MAX).unwrap();
        let low = FencingToken::new(e2, 1).unwrap();
        assert!(high < low);
        let max = FencingToken::new(Epoch::new(EPOCH_MAX).unwrap(), COUNTER_MAX).unwrap();
        assert_eq!(max.get(), i64::MAX as u64);
        assert_eq!(low.epoch(), e2);
        assert_eq!(low.counter(), 1);
    }

    #[test]
    fn out_of_range_values_are_refused() {
        assert!(Epoch::new(0).is_err());
        assert!(Epoch::new(EPOCH_MAX + 1).is_err());
        assert!(FencingToken::new(Epoch::FIRST, COUNTER_MAX + 1).is_err());
        assert_eq!(
            FencingToken::from_u64(u64::MAX),
            Err(TokenError::AboveBigint { token: u64::MAX })
        );
        assert!(
            FencingToken::from_u64(5).is_err(),
            "epoch 0 is never issued"
        );
    }
}

/// Unix time of 2026-01-01T00:00:00Z, the origin of the wall-clock epoch floor.
pub const EPOCH_FLOOR_ORIGIN_UNIX_S: u64 = 1_767_225_600;
/// One wall-clock epoch-floor step: ten minutes (2^23 steps last 159 years).
pub const EPOCH_FLOOR_STEP_S: u64 = 600;
/// A wall clock later than this many years after the origin is taken for a
/// wrong clock: its floor would use up a third of the epoch space at once.
pub const EPOCH_FLOOR_YEARS_MAX: u64 = 50;

/// Everything a restore knows about the tokens issued before it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RestoreFloors {
    /// The backup's epoch (`None`: restoring to an empty store without one).
    pub backup: Option<Epoch>,
    /// The epoch of the directory being replaced (its store or its identity).
    pub replaced: Option<Epoch>,
    /// The operator's `--min-epoch`.
    pub min_epoch: Option<Epoch>,
    /// The highest token the protected resources recorded (`--floor-from`).
    pub resources: Option<FencingToken>,
    /// Wall-clock seconds, for the ten-minute floor.
    pub now_unix_s: u64,
}

/// The epoch a restore starts: above the backup's, above the replaced
/// store's, above every token the resources recorded, at least `min_epoch`,
/// and at least a floor that grows by one every ten minutes of wall-clock
/// time since 2026. The resources' floor is the one that holds whatever the
/// history: it is read from where the tokens are enforced. The clock floor
/// covers a restore with no other knowledge, as long as two restores of
/// unknown history are more than ten minutes apart and the clock is not set
/// back. This is the one place Baton reads wall-clock time, and it only ever
/// raises the epoch; a clock beyond [`EPOCH_FLOOR_YEARS_MAX`] is refused.
pub fn restore_epoch(floors: &RestoreFloors) -> Result<Epoch, TokenError> {
    let latest_unix_s = EPOCH_FLOOR_ORIGIN_UNIX_S + EPOCH_FLOOR_YEARS_MAX * 365 * 86_400;
    if floors.now_unix_s > latest_unix_s {
        return Err(TokenError::ClockImplausible {
            now_unix_s: floors.now_unix_s,
            latest_unix_s,
        });
    }
    let clock =
        floors.now_unix_s.saturating_sub(EPOCH_FLOOR_ORIGIN_UNIX_S) / EPOCH_FLOOR_STEP_S + 1;
    let clock = u32::try_from(clock).unwrap_or(u32::MAX).min(EPOCH_MAX);
    let mut epoch = clock;
    for above in [
        floors.backup,
        floors.replaced,
        floors.resources.map(FencingToken::epoch),
    ]
    .into_iter()
    .flatten()
    {
        let next = if crate::bad::on(crate::bad::Variant::RestoreSameEpoch) {
            above
        } else {
            above.next()?
        };
        epoch = epoch.max(next.get());
    }
    if let Some(min) = floors.min_epoch {
        epoch = epoch.max(min.get());
    }
    Epoch::new(epoch)
}

#[cfg(test)]
mod restore_tests {
    use super::*;

    fn e(n: u32) -> Epoch {
        Epoch::new(n).unwrap()
    }

    fn floors(
        backup: u32,
        replaced: Option<u32>,
        min: Option<u32>,
        now_unix_s: u64,
    ) -> RestoreFloors {
        RestoreFloors {
            backup: Some(e(backup)),
            replaced: replaced.map(e),
            min_epoch: min.map(e),
            resources: None,
            now_unix_s,
        }
    }

    #[test]
    fn restore_epoch_is_above_everything_known() {
        let t0 = EPOCH_FLOOR_ORIGIN_UNIX_S;
        assert_eq!(restore_epoch(&floors(1, None, None, t0)), Ok(e(2)));
        assert_eq!(restore_epoch(&floors(1, Some(9), None, t0)), Ok(e(10)));
        assert_eq!(restore_epoch(&floors(1, Some(9), Some(50), t0)), Ok(e(50)));
        // A year after the origin the wall-clock floor dominates an old backup.
        let year = t0 + 365 * 86_400;
        assert_eq!(restore_epoch(&floors(1, None, None, year)), Ok(e(52_561)));
        // Two restores of one old backup, an hour apart, with the data dir lost in between.
        let first = restore_epoch(&floors(1, None, None, year)).unwrap();
        let second = restore_epoch(&floors(1, None, None, year + 3_600)).unwrap();
        assert!(second > first);
        assert!(restore_epoch(&floors(EPOCH_MAX, None, None, t0)).is_err());
    }

    #[test]
    fn the_resources_floor_holds_when_the_clock_is_set_back() {
        let t0 = EPOCH_FLOOR_ORIGIN_UNIX_S;
        let recorded = FencingToken::new(e(700), 12).unwrap();
        let restore = RestoreFloors {
            resources: Some(recorded),
            ..floors(1, None, None, t0 - 86_400)
        };
        assert_eq!(restore_epoch(&restore), Ok(e(701)));
        let empty = RestoreFloors {
            backup: None,
            ..restore
        };
        assert_eq!(restore_epoch(&empty), Ok(e(701)));
    }

    #[test]
    fn a_clock_centuries_ahead_is_refused() {
        let far = EPOCH_FLOOR_ORIGIN_UNIX_S + 200 * 365 * 86_400;
        assert!(matches!(
            restore_epoch(&floors(1, None, None, far)),
            Err(TokenError::ClockImplausible { .. })
        ));
    }
}

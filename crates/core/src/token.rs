use std::fmt;

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
    pub const FIRST: Epoch = Epoch(1);

    pub fn new(value: u32) -> Result<Self, TokenError> {
        if value == 0 || value > EPOCH_MAX {
            return Err(TokenError::EpochOutOfRange {
                epoch: u64::from(value),
            });
        }
        Ok(Self(value))
    }

    pub fn get(self) -> u32 {
        self.0
    }

    pub fn next(self) -> Result<Self, TokenError> {
        Self::new(self.0 + 1)
    }
}

/// An ordered generation number: `epoch << 40 | counter`.
///
/// Compare tokens as plain integers. Every token the service issues is above
/// every token it issued before, on every resource, so per resource they
/// strictly increase.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    pub fn new(epoch: Epoch, counter: u64) -> Result<Self, TokenError> {
        if counter > COUNTER_MAX {
            return Err(TokenError::CounterOutOfRange { counter });
        }
        Ok(Self((u64::from(epoch.0) << COUNTER_BITS) | counter))
    }

    /// Accepts any value that fits a `BIGINT` and names a valid epoch.
    pub fn from_u64(value: u64) -> Result<Self, TokenError> {
        if value > i64::MAX as u64 {
            return Err(TokenError::AboveBigint { token: value });
        }
        let token = Self(value);
        Epoch::new(token.epoch_value())?;
        Ok(token)
    }

    pub fn get(self) -> u64 {
        self.0
    }

    fn epoch_value(self) -> u32 {
        (self.0 >> COUNTER_BITS) as u32
    }

    pub fn epoch(self) -> Epoch {
        Epoch(self.epoch_value())
    }

    pub fn counter(self) -> u64 {
        self.0 & COUNTER_MAX
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    #[error("epoch {epoch} is out of range: epochs run from 1 to {EPOCH_MAX}")]
    EpochOutOfRange { epoch: u64 },
    #[error("token counter {counter} is above the per-epoch maximum {COUNTER_MAX}")]
    CounterOutOfRange { counter: u64 },
    #[error("token {token} does not fit a signed 64-bit integer (BIGINT)")]
    AboveBigint { token: u64 },
}

#[cfg(test)]
mod tests {
    use super::*;

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

/// Chooses the epoch a restore starts. The new epoch is above each of:
/// the backup's epoch, the epoch of the store being replaced (if any), and
/// `min_epoch - 1` (an operator's lower bound, for example the highest token
/// a resource recorded, shifted right by 40). It is also at least a floor
/// derived from the restore host's wall clock, in ten-minute steps since
/// 2026, which covers restores whose history is otherwise unknown (a lost
/// data directory after an earlier restore) as long as restores of unknown
/// history are more than ten minutes apart and the host clock is not set back.
/// This is the one place Baton reads wall-clock time, and it only ever
/// raises the epoch.
pub fn restore_epoch(
    backup: Epoch,
    replaced: Option<Epoch>,
    min_epoch: Option<Epoch>,
    now_unix_s: u64,
) -> Result<Epoch, TokenError> {
    let floor = now_unix_s.saturating_sub(EPOCH_FLOOR_ORIGIN_UNIX_S) / EPOCH_FLOOR_STEP_S + 1;
    let floor = u32::try_from(floor).unwrap_or(u32::MAX).min(EPOCH_MAX);
    let mut epoch = backup.next()?.get().max(floor);
    if let Some(replaced) = replaced {
        epoch = epoch.max(replaced.next()?.get());
    }
    if let Some(min) = min_epoch {
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

    #[test]
    fn restore_epoch_is_above_everything_known() {
        let t0 = EPOCH_FLOOR_ORIGIN_UNIX_S;
        assert_eq!(restore_epoch(e(1), None, None, t0), Ok(e(2)));
        assert_eq!(restore_epoch(e(1), Some(e(9)), None, t0), Ok(e(10)));
        assert_eq!(restore_epoch(e(1), Some(e(9)), Some(e(50)), t0), Ok(e(50)));
        // A year after the origin the wall-clock floor dominates an old backup.
        let floor = restore_epoch(e(1), None, None, t0 + 365 * 86_400).unwrap();
        assert_eq!(floor, e(52_561));
        // Two restores of one old backup, an hour apart, with the data dir lost in between.
        let first = restore_epoch(e(1), None, None, t0 + 365 * 86_400).unwrap();
        let second = restore_epoch(e(1), None, None, t0 + 365 * 86_400 + 3_600).unwrap();
        assert!(second > first);
        assert!(restore_epoch(e(EPOCH_MAX), None, None, t0).is_err());
    }
}

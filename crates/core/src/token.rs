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

//! How a command holds its resources: the shape options of `acquire`,
//! `hold` and `run`, and the operator's number of permits.

use clap::Args;

/// How a command holds its resources: exclusive (the default), shared, or
/// as a permit of a semaphore; every name alike, but those that
/// `--shared-on` and `--permits-on` give a shape of their own (mixed in
/// the one all-or-nothing request).
#[derive(Args, Clone, Default)]
pub struct ShapeOpt {
    /// Hold shared, beside other shared holders and no exclusive one (a
    /// reader): see docs/locks.md.
    #[arg(long, conflicts_with = "permits")]
    pub shared: bool,
    /// Hold one of N permits of a semaphore (at most N holders at once,
    /// 1 to 4096; every request on the name must ask the same N): see
    /// docs/locks.md.
    #[arg(long, value_name = "N", value_parser = parse_permits)]
    pub permits: Option<u32>,
    /// Hold NAME, one of the command's names, shared, and the others as
    /// the options above say (repeatable).
    #[arg(long, value_name = "NAME")]
    pub shared_on: Vec<String>,
    /// Hold NAME, one of the command's names, as one of N permits of a
    /// semaphore, and the others as the options above say (repeatable).
    #[arg(long, value_name = "NAME=N", value_parser = parse_permits_on)]
    pub permits_on: Vec<(String, u32)>,
}

impl ShapeOpt {
    /// The shape asked for every name not given one of its own.
    fn shape(&self) -> baton_core::Shape {
        match (self.shared, self.permits) {
            (_, Some(n)) => baton_core::Shape::Permits(n),
            (true, None) => baton_core::Shape::Shared,
            (false, None) => baton_core::Shape::Exclusive,
        }
    }

    /// Each of `names` with the shape asked for it; a `--shared-on` or
    /// `--permits-on` for a name the command does not hold, or both for
    /// one name, is refused naming it.
    pub fn claims(&self, names: &[String]) -> Result<Vec<(String, baton_core::Shape)>, ShapeError> {
        let canonical = |n: &str| {
            baton_core::ResourceName::parse(n).map_or_else(|_| n.to_string(), |r| r.to_string())
        };
        let held: Vec<String> = names.iter().map(|n| canonical(n)).collect();
        let mut own: Vec<(String, baton_core::Shape)> = Vec::new();
        let given = self
            .shared_on
            .iter()
            .map(|n| (n, baton_core::Shape::Shared, "--shared-on"))
            .chain(
                self.permits_on
                    .iter()
                    .map(|(n, k)| (n, baton_core::Shape::Permits(*k), "--permits-on")),
            );
        for (name, shape, option) in given {
            let name = canonical(name);
            if !held.contains(&name) {
                return Err(ShapeError::NotNamed { option, name });
            }
            if own.iter().any(|(n, _)| *n == name) {
                return Err(ShapeError::Twice { name });
            }
            own.push((name, shape));
        }
        Ok(names
            .iter()
            .zip(&held)
            .map(|(raw, name)| {
                let shape = own.iter().find(|(n, _)| n == name).map(|(_, s)| *s);
                (raw.clone(), shape.unwrap_or_else(|| self.shape()))
            })
            .collect())
    }
}

/// A per-name shape that does not fit the command's names.
#[derive(Debug, thiserror::Error)]
pub enum ShapeError {
    /// The option names a resource the command does not hold.
    #[error("{option} {name}: not one of the command's names")]
    NotNamed { option: &'static str, name: String },
    /// One name given two shapes of its own.
    #[error("{name} is given a shape twice (--shared-on, --permits-on): one shape per name")]
    Twice { name: String },
    /// `--permits-on` without `NAME=N`.
    #[error("--permits-on {raw:?}: write NAME=N, a name and its number of permits")]
    NotNameEqualsN { raw: String },
    /// `--permits-on NAME=N` whose N is not a number of permits.
    #[error(transparent)]
    Permits(#[from] PermitsError),
}

/// `NAME=N` of `--permits-on`: split at the last `=` (a name may hold one).
fn parse_permits_on(raw: &str) -> Result<(String, u32), ShapeError> {
    let Some((name, n)) = raw.rsplit_once('=').filter(|(name, _)| !name.is_empty()) else {
        return Err(ShapeError::NotNameEqualsN {
            raw: raw.to_string(),
        });
    };
    Ok((name.to_string(), parse_permits(n)?))
}

/// A number of permits that is not one.
#[derive(Debug, thiserror::Error)]
#[error("{raw:?} is not a number of permits: a semaphore has from 1 to {max}")]
pub struct PermitsError {
    raw: String,
    max: u32,
}

/// A semaphore's number of permits: 1 to [`baton_core::PERMITS_MAX`].
pub fn parse_permits(raw: &str) -> Result<u32, PermitsError> {
    let max = baton_core::PERMITS_MAX;
    match raw.parse::<u32>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(PermitsError {
            raw: raw.to_string(),
            max,
        }),
    }
}

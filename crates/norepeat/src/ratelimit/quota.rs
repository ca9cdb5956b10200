//! How much traffic a limiter admits, and with which algorithm.

use std::fmt;
use std::num::NonZeroU32;
use std::str::FromStr;
use std::time::Duration;

/// A rate: `max` requests per `period`, with up to `burst` at once.
///
/// Built from [`NonZeroU32`] by `const fn`s, so a zero rate cannot be
/// written and a quota can live in a `const`:
///
/// ```
/// use norepeat::ratelimit::Quota;
/// use std::num::NonZeroU32;
/// use std::time::Duration;
///
/// const FIVE: NonZeroU32 = NonZeroU32::new(5).expect("5 is not zero");
/// const FLASH: Quota = Quota::per_second(FIVE);
/// assert_eq!(FLASH.emission(), Duration::from_millis(200));
/// assert_eq!(Quota::parse("5/s"), Ok(FLASH));
/// assert_eq!(Quota::parse("120/m")?.period(), Duration::from_secs(60));
/// assert!(Quota::parse("0/s").is_err());
/// # Ok::<(), norepeat::ratelimit::ParseQuotaError>(())
/// ```
///
/// How each [`Algorithm`] reads it:
/// - the windows admit `max` requests per `period` (the burst is not used);
/// - GCRA admits one request every `period / max` (the *emission interval*)
///   and lets up to `burst` (default `max`) come at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    max: NonZeroU32,
    period: Duration,
    burst: NonZeroU32,
}

impl Quota {
    /// `max` requests per second.
    #[must_use]
    pub const fn per_second(max: NonZeroU32) -> Self {
        Self::per(max, Duration::from_secs(1))
    }

    /// `max` requests per minute.
    #[must_use]
    pub const fn per_minute(max: NonZeroU32) -> Self {
        Self::per(max, Duration::from_secs(60))
    }

    /// `max` requests per hour.
    #[must_use]
    pub const fn per_hour(max: NonZeroU32) -> Self {
        Self::per(max, Duration::from_secs(3600))
    }

    /// `max` requests per `period`; `None` when `period` is zero.
    #[must_use]
    pub const fn new(max: NonZeroU32, period: Duration) -> Option<Self> {
        if period.is_zero() {
            None
        } else {
            Some(Self::per(max, period))
        }
    }

    /// One request every `period` (as governor's `Quota::with_period`);
    /// `None` when `period` is zero.
    #[must_use]
    pub const fn with_period(period: Duration) -> Option<Self> {
        Self::new(NonZeroU32::MIN, period)
    }

    const fn per(max: NonZeroU32, period: Duration) -> Self {
        Self {
            max,
            period,
            burst: max,
        }
    }

    /// Lets up to `burst` requests come at once (GCRA only; the windows
    /// admit `max` per `period` whatever the burst).
    #[must_use]
    pub const fn allow_burst(mut self, burst: NonZeroU32) -> Self {
        self.burst = burst;
        self
    }

    /// Requests per period.
    #[must_use]
    pub const fn max(&self) -> NonZeroU32 {
        self.max
    }

    /// The period (a window's length).
    #[must_use]
    pub const fn period(&self) -> Duration {
        self.period
    }

    /// Requests admitted at once by GCRA.
    #[must_use]
    pub const fn burst(&self) -> NonZeroU32 {
        self.burst
    }

    /// The interval between requests at the sustained rate
    /// (`period / max`, at least 1 µs).
    #[must_use]
    pub fn emission(&self) -> Duration {
        (self.period / self.max.get()).max(Duration::from_micros(1))
    }

    /// Reads `N/s`, `N/m` or `N/h` (also `N/sec`, `N/min`, `N/hour`, with
    /// spaces allowed around the parts), as in `NOREPEAT_FLASH_RATE=5/s`.
    ///
    /// # Errors
    /// When the text is not of that form, `N` is not a whole number from 1
    /// to 4294967295, or the unit is unknown.
    pub fn parse(text: &str) -> Result<Self, ParseQuotaError> {
        let (count, unit) = text
            .split_once('/')
            .ok_or_else(|| ParseQuotaError::Format(text.to_owned()))?;
        let count = count.trim();
        let max = count
            .parse::<u32>()
            .ok()
            .and_then(NonZeroU32::new)
            .ok_or_else(|| ParseQuotaError::Count(count.to_owned()))?;
        let period = match unit.trim() {
            "s" | "sec" | "second" => Duration::from_secs(1),
            "m" | "min" | "minute" => Duration::from_secs(60),
            "h" | "hour" => Duration::from_secs(3600),
            other => return Err(ParseQuotaError::Unit(other.to_owned())),
        };
        Ok(Self::per(max, period))
    }
}

impl FromStr for Quota {
    type Err = ParseQuotaError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for Quota {
    /// `5/s`, `10/m`, `1/h`, or `N/<period>` for other periods; with
    /// `burst B` when it is not `max`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unit = match self.period.as_secs() {
            _ if self.period.subsec_nanos() != 0 => None,
            1 => Some("s"),
            60 => Some("m"),
            3600 => Some("h"),
            _ => None,
        };
        match unit {
            Some(u) => write!(f, "{}/{u}", self.max)?,
            None => write!(f, "{}/{:?}", self.max, self.period)?,
        }
        if self.burst != self.max {
            write!(f, " burst {}", self.burst)?;
        }
        Ok(())
    }
}

/// Why a quota's text did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseQuotaError {
    /// Not of the form `N/unit`.
    #[error("a rate is written N/s, N/m or N/h, not {0:?}")]
    Format(String),
    /// `N` is not a whole number from 1 to 4294967295.
    #[error("the count of a rate must be a whole number from 1 to 4294967295, not {0:?}")]
    Count(String),
    /// The unit is not `s`, `m` or `h`.
    #[error("the unit of a rate must be s, m or h, not {0:?}")]
    Unit(String),
}

/// Which algorithm a limiter runs. Each is one atomic store operation (one
/// Lua script on Redis, one per-key critical section in memory), and all
/// three take their clock from the store (Redis `TIME`), so every instance
/// sharing a store shares one quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Algorithm {
    /// A counter per window, the window starting at its first request:
    /// exact within a window, but up to twice the quota can pass around a
    /// window's end.
    FixedWindow,
    /// Two fixed windows, the previous one weighted by how much of it the
    /// sliding window still covers; see
    /// [`arithmetic::sliding_window`](crate::store::rate::arithmetic::sliding_window) for
    /// its error bound.
    SlidingWindow,
    /// The generic cell rate algorithm: one stored number per key, the
    /// theoretical arrival time. Smooth, exact, and the default.
    #[default]
    Gcra,
}

impl Algorithm {
    /// One letter in the store key, so that a key never changes type when
    /// a route changes algorithm (a Redis hash is not a string).
    pub(crate) const fn letter(self) -> &'static [u8] {
        match self {
            Algorithm::FixedWindow => b"f",
            Algorithm::SlidingWindow => b"s",
            Algorithm::Gcra => b"g",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nz(n: u32) -> NonZeroU32 {
        NonZeroU32::new(n).unwrap()
    }

    #[test]
    fn parses_what_the_shop_accepts() {
        assert_eq!(Quota::parse("5/s"), Ok(Quota::per_second(nz(5))));
        assert_eq!(Quota::parse(" 7 / m "), Ok(Quota::per_minute(nz(7))));
        assert_eq!(Quota::parse("1/hour"), Ok(Quota::per_hour(nz(1))));
        assert!(matches!(Quota::parse("5"), Err(ParseQuotaError::Format(_))));
        assert!(matches!(
            Quota::parse("0/s"),
            Err(ParseQuotaError::Count(_))
        ));
        assert!(matches!(
            Quota::parse("-1/s"),
            Err(ParseQuotaError::Count(_))
        ));
        assert!(matches!(
            Quota::parse("x/s"),
            Err(ParseQuotaError::Count(_))
        ));
        assert!(matches!(Quota::parse("5/d"), Err(ParseQuotaError::Unit(_))));
        assert!(matches!(Quota::parse(""), Err(ParseQuotaError::Format(_))));
    }

    #[test]
    fn displays_as_parsed() {
        for s in ["5/s", "10/m", "1/h"] {
            assert_eq!(Quota::parse(s).unwrap().to_string(), s);
        }
        let q = Quota::per_second(nz(5)).allow_burst(nz(1));
        assert_eq!(q.to_string(), "5/s burst 1");
    }

    #[test]
    fn zero_periods_are_refused() {
        assert_eq!(Quota::with_period(Duration::ZERO), None);
        assert_eq!(Quota::new(nz(3), Duration::ZERO), None);
        let q = Quota::with_period(Duration::from_millis(250)).unwrap();
        assert_eq!((q.max().get(), q.burst().get()), (1, 1));
        assert_eq!(q.emission(), Duration::from_millis(250));
    }
}

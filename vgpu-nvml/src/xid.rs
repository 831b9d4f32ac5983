//! Which Xid errors make a GPU unhealthy: the NVIDIA device plugin's rules, as a pure value.
//!
//! The policy starts from the application Xids that never mark a GPU unhealthy
//! ([`APPLICATION_XIDS`]: 13, 31, 43, 45, 68, 109), adds a configurable list (vgpu-manager's
//! `--additional-xids-to-ignore`) and the `DP_DISABLE_HEALTHCHECKS` list, then removes what
//! `DP_ENABLE_HEALTHCHECKS` names. Both variables are comma-separated, case-insensitive lists of decimal
//! Xids; the words `all` or `xids` anywhere in a list stand for every Xid. Blank and malformed entries are
//! skipped (and reported by [`XidPolicy::from_env_values`]).
//!
//! | `DP_DISABLE_HEALTHCHECKS` | `DP_ENABLE_HEALTHCHECKS` | effect |
//! |---|---|---|
//! | unset | unset | every Xid but the application ones is critical |
//! | `all` or `xids` | unset | health checks off ([`XidPolicy::is_all_disabled`]) |
//! | `48,79` | unset | 48 and 79 ignored as well |
//! | `all` | `79` | only Xid 79 is watched |
//! | unset | `all` | every Xid is critical, application ones included |
//! | unset | `13` | 13 is critical again |
//!
//! One deliberate difference from the Go plugin: there, `DP_DISABLE_HEALTHCHECKS=all` switches the whole
//! health check off even when `DP_ENABLE_HEALTHCHECKS` lists Xids, although its documentation says the
//! enabled Xids are still watched. This policy follows the documentation. In Go the Xid `0` also collides
//! with the "all" marker; here it is an ordinary Xid.
//!
//! ```
//! use vgpu_nvml::xid::XidPolicy;
//!
//! let policy = XidPolicy::from_env_values(Some("all"), Some("79"), &[]).policy;
//! assert!(!policy.is_all_disabled());
//! assert!(policy.is_critical(79));
//! assert!(!policy.is_critical(48));
//!
//! let default = XidPolicy::default();
//! assert!(!default.is_critical(13) && default.is_critical(48));
//! ```

use std::collections::BTreeSet;

use vgpu_core::backend::HealthEventKind;

pub use vgpu_core::backend::health::APPLICATION_XIDS;

/// The variable that disables health checks (`all`, `xids`, or a list of Xids to ignore).
pub const ENV_DISABLE_HEALTHCHECKS: &str = "DP_DISABLE_HEALTHCHECKS";
/// The variable that re-enables Xids (`all`, or a list), overriding every ignore list.
pub const ENV_ENABLE_HEALTHCHECKS: &str = "DP_ENABLE_HEALTHCHECKS";

/// A parsed Xid list: every Xid, or a set.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct XidList {
    /// `all` or `xids` was named.
    pub all: bool,
    /// The Xids named (empty when `all`).
    pub xids: BTreeSet<u64>,
}

impl XidList {
    /// Parses a comma-separated list, returning the list and the entries that were skipped as malformed.
    ///
    /// ```
    /// use vgpu_nvml::xid::XidList;
    /// let (list, bad) = XidList::parse(" 48, x ,79,,");
    /// assert_eq!(list.xids.into_iter().collect::<Vec<_>>(), vec![48, 79]);
    /// assert_eq!(bad, vec!["x".to_owned()]);
    /// assert!(XidList::parse("48,XIDS").0.all);
    /// ```
    pub fn parse(text: &str) -> (Self, Vec<String>) {
        let mut list = Self::default();
        let mut malformed = Vec::new();
        for entry in text.split(',') {
            let entry = entry.trim().to_ascii_lowercase();
            match entry.as_str() {
                "" => {}
                "all" | "xids" => return (Self { all: true, xids: BTreeSet::new() }, Vec::new()),
                digits => match digits.parse::<u64>() {
                    Ok(xid) => {
                        list.xids.insert(xid);
                    }
                    Err(_) => malformed.push(excerpt(digits)),
                },
            }
        }
        (list, malformed)
    }
}

fn excerpt(text: &str) -> String {
    text.chars().take(40).collect()
}

/// Decides which Xids are critical (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidPolicy {
    all_disabled: bool,
    all_enabled: bool,
    ignored: BTreeSet<u64>,
    enabled: BTreeSet<u64>,
}

impl Default for XidPolicy {
    /// Ignores [`APPLICATION_XIDS`] only.
    fn default() -> Self {
        Self::new(&XidList::default(), &XidList::default(), &[])
    }
}

/// A policy read from the environment, with the entries that were skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedXidPolicy {
    /// The policy.
    pub policy: XidPolicy,
    /// `VARIABLE: entry` for each malformed entry (skipped, as the device plugin does).
    pub malformed: Vec<String>,
}

impl XidPolicy {
    /// Builds the policy from the disable and enable lists and an extra ignore list.
    pub fn new(disable: &XidList, enable: &XidList, additional_ignored: &[u64]) -> Self {
        let mut ignored: BTreeSet<u64> = APPLICATION_XIDS.iter().copied().collect();
        ignored.extend(additional_ignored.iter().copied());
        ignored.extend(disable.xids.iter().copied());
        Self { all_disabled: disable.all, all_enabled: enable.all, ignored, enabled: enable.xids.clone() }
    }

    /// Builds the policy from the values of `DP_DISABLE_HEALTHCHECKS` and `DP_ENABLE_HEALTHCHECKS`.
    pub fn from_env_values(
        disable: Option<&str>,
        enable: Option<&str>,
        additional_ignored: &[u64],
    ) -> ParsedXidPolicy {
        let (disable_list, bad_disable) = XidList::parse(disable.unwrap_or(""));
        let (enable_list, bad_enable) = XidList::parse(enable.unwrap_or(""));
        let malformed = bad_disable
            .into_iter()
            .map(|e| format!("{ENV_DISABLE_HEALTHCHECKS}: {e}"))
            .chain(bad_enable.into_iter().map(|e| format!("{ENV_ENABLE_HEALTHCHECKS}: {e}")))
            .collect();
        ParsedXidPolicy { policy: Self::new(&disable_list, &enable_list, additional_ignored), malformed }
    }

    /// Reads `DP_DISABLE_HEALTHCHECKS` and `DP_ENABLE_HEALTHCHECKS` from the process environment.
    pub fn from_env(additional_ignored: &[u64]) -> ParsedXidPolicy {
        let disable = std::env::var(ENV_DISABLE_HEALTHCHECKS).ok();
        let enable = std::env::var(ENV_ENABLE_HEALTHCHECKS).ok();
        Self::from_env_values(disable.as_deref(), enable.as_deref(), additional_ignored)
    }

    /// Whether Xid health checking is off altogether (everything disabled and nothing re-enabled): the
    /// backend then does not watch events at all.
    pub fn is_all_disabled(&self) -> bool {
        self.all_disabled && !self.all_enabled && self.enabled.is_empty()
    }

    /// Whether `xid` makes a GPU unhealthy.
    pub fn is_critical(&self, xid: u64) -> bool {
        if self.all_enabled || self.enabled.contains(&xid) {
            return true;
        }
        !self.all_disabled && !self.ignored.contains(&xid)
    }

    /// The Xids ignored on top of "everything" / "nothing" (for logs).
    pub fn ignored(&self) -> impl Iterator<Item = u64> + '_ {
        self.ignored.iter().copied().filter(|x| !self.enabled.contains(x))
    }
}

/// What an NVML event carried, reduced to what the health decision needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawEvent {
    /// The Xid of a critical-Xid event (`nvmlEventTypeXidCriticalError`); NVML's "unknown" Xid is 999.
    pub xid: Option<u64>,
    /// A double-bit (uncorrectable) ECC error event.
    pub double_bit_ecc: bool,
}

/// The Xid NVML reports when it does not know the Xid.
pub const UNKNOWN_XID: u64 = 999;

/// Turns an event into the health event to report, or `None` to skip it: critical Xids (per `policy`)
/// become [`HealthEventKind::Xid`], double-bit ECC errors [`HealthEventKind::EccUncorrectable`]; ignored Xids,
/// single-bit ECC and other events are skipped. When every Xid is disabled, nothing is reported.
///
/// ```
/// use vgpu_nvml::xid::{RawEvent, XidPolicy, classify_event};
/// use vgpu_core::backend::HealthEventKind;
/// let policy = XidPolicy::default();
/// assert_eq!(classify_event(RawEvent { xid: Some(79), double_bit_ecc: false }, &policy), Some(HealthEventKind::Xid { code: 79 }));
/// assert_eq!(classify_event(RawEvent { xid: Some(13), double_bit_ecc: false }, &policy), None);
/// ```
pub fn classify_event(event: RawEvent, policy: &XidPolicy) -> Option<HealthEventKind> {
    if policy.is_all_disabled() {
        return None;
    }
    match event.xid {
        Some(code) if policy.is_critical(code) => Some(HealthEventKind::Xid { code }),
        Some(_) => None,
        None if event.double_bit_ecc => Some(HealthEventKind::EccUncorrectable),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn policy(disable: Option<&str>, enable: Option<&str>) -> XidPolicy {
        XidPolicy::from_env_values(disable, enable, &[]).policy
    }

    #[test]
    fn defaults_ignore_application_xids() {
        let p = XidPolicy::default();
        for xid in APPLICATION_XIDS {
            assert!(!p.is_critical(xid), "{xid}");
        }
        for xid in [0, 48, 63, 64, 74, 79, 92, 94, 95, 119] {
            assert!(p.is_critical(xid), "{xid}");
        }
        assert!(!p.is_all_disabled());
    }

    #[test]
    fn env_table() {
        assert!(policy(Some("all"), None).is_all_disabled());
        assert!(policy(Some("xids"), None).is_all_disabled());
        assert!(policy(Some("48,XIDS"), None).is_all_disabled());
        let p = policy(Some(" 48 , 79"), None);
        assert!(!p.is_critical(48) && !p.is_critical(79) && p.is_critical(94) && !p.is_critical(13));
        let p = policy(Some("all"), Some("79"));
        assert!(!p.is_all_disabled() && p.is_critical(79) && !p.is_critical(48));
        let p = policy(None, Some("ALL"));
        assert!(p.is_critical(13) && p.is_critical(109));
        let p = policy(Some("all"), Some("all"));
        assert!(!p.is_all_disabled() && p.is_critical(31));
        let p = policy(None, Some("13"));
        assert!(p.is_critical(13) && !p.is_critical(31));
        assert_eq!(policy(Some(""), Some("")), XidPolicy::default());
    }

    #[test]
    fn events() {
        let p = XidPolicy::default();
        let xid = |code| RawEvent { xid: Some(code), double_bit_ecc: false };
        assert_eq!(classify_event(xid(48), &p), Some(HealthEventKind::Xid { code: 48 }));
        assert_eq!(classify_event(xid(UNKNOWN_XID), &p), Some(HealthEventKind::Xid { code: 999 }));
        assert_eq!(classify_event(xid(109), &p), None);
        let dbe = RawEvent { xid: None, double_bit_ecc: true };
        assert_eq!(classify_event(dbe, &p), Some(HealthEventKind::EccUncorrectable));
        assert_eq!(classify_event(RawEvent::default(), &p), None);
        assert_eq!(classify_event(dbe, &policy(Some("all"), None)), None);
    }

    #[test]
    fn additional_and_malformed() {
        let parsed = XidPolicy::from_env_values(Some("48,abc,-1"), Some("x"), &[94]);
        assert!(!parsed.policy.is_critical(94) && !parsed.policy.is_critical(48));
        assert_eq!(
            parsed.malformed,
            vec![
                "DP_DISABLE_HEALTHCHECKS: abc".to_owned(),
                "DP_DISABLE_HEALTHCHECKS: -1".to_owned(),
                "DP_ENABLE_HEALTHCHECKS: x".to_owned()
            ]
        );
        assert!(parsed.policy.ignored().any(|x| x == 94));
    }

    proptest! {
        #[test]
        fn parse_never_panics_and_keeps_numbers(text in ".{0,80}") {
            let (list, _) = XidList::parse(&text);
            if !list.all {
                for xid in &list.xids {
                    prop_assert!(text.contains(&xid.to_string()) || text.contains('0'));
                }
            }
        }

        #[test]
        fn enable_always_wins(disable in prop::collection::vec(0u64..200, 0..8), xid in 0u64..200, all in any::<bool>()) {
            let mut text: Vec<String> = disable.iter().map(u64::to_string).collect();
            if all { text.push("all".into()); }
            let p = policy(Some(&text.join(",")), Some(&xid.to_string()));
            prop_assert!(p.is_critical(xid));
            prop_assert!(!p.is_all_disabled());
        }

        #[test]
        fn disabled_xids_are_not_critical(disable in prop::collection::vec(0u64..200, 1..8)) {
            let text: Vec<String> = disable.iter().map(u64::to_string).collect();
            let p = policy(Some(&text.join(",")), None);
            for xid in disable {
                prop_assert!(!p.is_critical(xid));
            }
        }
    }
}

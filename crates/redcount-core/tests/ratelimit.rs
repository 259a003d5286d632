//! The RateLimit fields, parsed back with a Structured Fields parser (RFC 9651, the `sfv`
//! crate) over generated outcomes of every kind: each field is a List of String items named
//! after their policies, in order, whose parameters say what the outcomes say.

use proptest::prelude::*;
use redcount_core::ops::claim::ClaimOutcome;
use redcount_core::ops::decision::{LeaseResult, PartOutcome};
use redcount_core::ops::quota::{Algorithm, QuotaOutcome};
use redcount_core::ops::semaphore::{SemaphoreOutcome, SemaphoreResult};
use redcount_core::ratelimit::{self, Limit};
use sfv::{BareItem, List, ListEntry, Parser};

fn algorithm() -> impl Strategy<Value = Algorithm> {
    prop_oneof![
        (1..1_000_000_i64, 1..1_000_000_000_000_i64)
            .prop_map(|(limit, window_ms)| Algorithm::FixedWindow { limit, window_ms }),
        (1..10_000_i64, 1..1_000_000_000_000_i64)
            .prop_map(|(limit, window_ms)| Algorithm::SlidingWindow { limit, window_ms }),
        (1..1_000_000_i64, 1..1_000_i64, 1..86_400_000_i64).prop_map(|(capacity, refill, interval_ms)| {
            Algorithm::TokenBucket { capacity, refill: refill.min(capacity), interval_ms }
        }),
        (1..1_000_000_i64, 1..86_400_000_i64, 1..1_000_i64).prop_map(|(rate, period_ms, burst)| Algorithm::Gcra {
            rate,
            period_ms,
            burst
        }),
    ]
}

fn quota() -> impl Strategy<Value = QuotaOutcome> {
    (any::<bool>(), 1..1_000_000_i64, 0..1_000_000_i64, 0..1_000_000_000_000_i64, 0..1_000_000_000_000_i64).prop_map(
        |(allowed, limit, remaining, reset_ms, retry)| QuotaOutcome {
            allowed,
            limit,
            remaining: remaining.min(limit),
            reset_ms,
            retry_after_ms: if allowed { 0 } else { retry.max(1) },
        },
    )
}

fn lease() -> impl Strategy<Value = SemaphoreOutcome> {
    (1..10_000_i64, 0..10_001_i64, proptest::option::of(0..1_000_000_000_i64), any::<bool>()).prop_map(
        |(limit, in_use, earliest_end_ms, holding)| SemaphoreOutcome {
            result: if holding { SemaphoreResult::Acquired } else { SemaphoreResult::Full },
            in_use: in_use.min(limit),
            limit,
            earliest_end_ms,
            lease_ms: 1000,
            fencing_token: None,
        },
    )
}

/// What a generated outcome must read as: its name and parameters.
#[derive(Debug, Clone)]
struct Expected {
    name: String,
    q: i64,
    qu: Option<&'static str>,
    w: Option<i64>,
    r: i64,
    t: Option<i64>,
}

/// One generated part: a policy name and the outcome it had.
#[derive(Debug, Clone)]
enum Case {
    Quota(Algorithm, QuotaOutcome),
    Claim(i64, ClaimOutcome),
    Lease(SemaphoreOutcome),
}

fn case() -> impl Strategy<Value = (String, Case)> {
    let name = "[A-Za-z0-9_-]{1,64}";
    prop_oneof![
        (name, algorithm(), quota()).prop_map(|(n, a, o)| (n, Case::Quota(a, o))),
        (name, 1..1_000_000_000_000_i64, proptest::option::of(0..1_000_000_000_000_i64), any::<bool>())
            .prop_map(|(n, w, left, claimed)| (n, Case::Claim(w, ClaimOutcome { claimed, window_left_ms: left }))),
        (name, lease()).prop_map(|(n, o)| (n, Case::Lease(o))),
    ]
}

fn limit_of<'a>(name: &'a str, case: &Case) -> Limit<'a> {
    match case {
        Case::Quota(a, o) => Limit::quota(name, a, o),
        Case::Claim(w, o) => Limit::claim(name, *w, o),
        Case::Lease(o) => Limit::lease(name, o),
    }
}

/// The model: what each field must say, written from the draft's definitions.
fn expected(name: &str, case: &Case) -> Expected {
    let secs = |ms: i64| (ms + 999) / 1000;
    match case {
        Case::Quota(a, o) => {
            let whole_ms = match *a {
                Algorithm::FixedWindow { window_ms, .. } | Algorithm::SlidingWindow { window_ms, .. } => window_ms,
                Algorithm::TokenBucket { refill, interval_ms, .. } => (o.limit + refill - 1) / refill * interval_ms,
                Algorithm::Gcra { rate, period_ms, .. } => i64::try_from(
                    (i128::from(o.limit) * i128::from(period_ms) + i128::from(rate) - 1) / i128::from(rate),
                )
                .unwrap(),
            };
            Expected {
                name: name.into(),
                q: o.limit,
                qu: None,
                w: Some(secs(whole_ms).max(1)),
                r: o.remaining,
                t: Some(secs(if o.allowed { o.reset_ms } else { o.retry_after_ms })),
            }
        }
        Case::Claim(w, o) => Expected {
            name: name.into(),
            q: 1,
            qu: None,
            w: Some(secs(*w).max(1)),
            r: 0,
            t: o.window_left_ms.map(secs),
        },
        Case::Lease(o) => {
            let r = o.limit - o.in_use;
            Expected {
                name: name.into(),
                q: o.limit,
                qu: Some("concurrent-requests"),
                w: None,
                r,
                t: if r == 0 { o.earliest_end_ms.map(secs) } else { None },
            }
        }
    }
}

/// Parses a field as a List of String items: (name, parameters by key).
fn parse(field: &str) -> Vec<(String, Vec<(String, BareItem)>)> {
    let list: List = Parser::new(field).parse().unwrap_or_else(|e| panic!("not a Structured Field List: {e}: {field}"));
    list.into_iter()
        .map(|entry| {
            let ListEntry::Item(item) = entry else { panic!("an inner list in {field}") };
            let name = item.bare_item.as_string().unwrap_or_else(|| panic!("the item is not a String: {field}"));
            let params = item.params.into_iter().map(|(k, v)| (k.as_str().to_owned(), v)).collect();
            (name.as_str().to_owned(), params)
        })
        .collect()
}

fn int(params: &[(String, BareItem)], key: &str) -> Option<i64> {
    params.iter().find(|(k, _)| k == key).map(|(_, v)| i64::from(v.as_integer().expect("an Integer")))
}

proptest! {
    #[test]
    fn both_fields_parse_back_to_what_the_outcomes_say(cases in proptest::collection::vec(case(), 1..6)) {
        let limits: Vec<Limit<'_>> = cases.iter().map(|(n, c)| limit_of(n, c)).collect();
        let want: Vec<Expected> = cases.iter().map(|(n, c)| expected(n, c)).collect();
        let policy = parse(&ratelimit::policy_field(&limits));
        let limit = parse(&ratelimit::limit_field(&limits));
        prop_assert_eq!(policy.len(), want.len());
        prop_assert_eq!(limit.len(), want.len());
        for ((w, (pname, pparams)), (lname, lparams)) in want.iter().zip(&policy).zip(&limit) {
            prop_assert_eq!(pname, &w.name);
            prop_assert_eq!(lname, &w.name);
            prop_assert_eq!(int(pparams, "q"), Some(w.q));
            prop_assert_eq!(int(pparams, "w"), w.w);
            let qu = pparams.iter().find(|(k, _)| k == "qu").map(|(_, v)| v.as_string().expect("a String").as_str().to_owned());
            prop_assert_eq!(qu.as_deref(), w.qu);
            prop_assert_eq!(int(lparams, "r"), Some(w.r));
            prop_assert_eq!(int(lparams, "t"), w.t);
            // Every value is one the draft allows: non-negative, a window never 0.
            prop_assert!(w.r >= 0 && w.q >= 0 && w.w.is_none_or(|w| w >= 1) && w.t.is_none_or(|t| t >= 0));
        }
    }

    /// On a denied take `Retry-After` never names a time before `t` (the draft's SHOULD NOT).
    #[test]
    fn retry_after_is_never_before_the_reset(a in algorithm(), o in quota()) {
        prop_assume!(!o.allowed);
        let l = Limit::quota("p", &a, &o);
        prop_assert!(ratelimit::retry_after_s(o.retry_after_ms) >= l.reset_s.unwrap());
    }

    /// A compound decision: one item per part, named after its policy, in the parts' order.
    #[test]
    fn a_decision_has_one_item_per_part(parts in proptest::collection::vec((algorithm(), quota(), lease(), any::<bool>()), 1..5)) {
        let names: Vec<String> = (0..parts.len()).map(|i| format!("policy-{i}")).collect();
        let outcomes: Vec<(Option<Algorithm>, PartOutcome)> = parts.iter().map(|(a, q, s, is_quota)| {
            if *is_quota {
                (Some(*a), PartOutcome::Quota(*q))
            } else {
                (None, PartOutcome::Lease {
                    result: LeaseResult::Acquired, in_use: s.in_use, limit: s.limit,
                    earliest_end_ms: s.earliest_end_ms, retry_after_ms: 0, lease_ms: 1, fencing_token: Some(1),
                })
            }
        }).collect();
        let limits: Vec<Limit<'_>> = names.iter().zip(&outcomes)
            .map(|(n, (a, o))| Limit::part(n, a.as_ref(), o).unwrap())
            .collect();
        let got: Vec<String> = parse(&ratelimit::limit_field(&limits)).into_iter().map(|(n, _)| n).collect();
        prop_assert_eq!(got, names);
    }
}

#[test]
fn names_that_need_escaping_still_parse() {
    let o = QuotaOutcome { allowed: true, limit: 1, remaining: 1, reset_ms: 0, retry_after_ms: 0 };
    let a = Algorithm::FixedWindow { limit: 1, window_ms: 1 };
    for name in [r#"a"b"#, r"back\slash", "naïve", "tab\there"] {
        let field = ratelimit::policy_field(&[Limit::quota(name, &a, &o)]);
        let parsed = parse(&field);
        assert_eq!(parsed.len(), 1, "{field}");
        if name.is_ascii() && !name.contains('\t') {
            assert_eq!(parsed[0].0, name, "{field}");
        }
    }
}

//! The API as an OpenAPI 3.1 document, generated from the route table ([`crate::ROUTES`]):
//! every route with its parameters, request and answer schemas, every status it can answer,
//! its headers (`Retry-After`, `RateLimit-Policy`, `RateLimit`, `Idempotency-Key`,
//! `Idempotent-Replayed`) and the admin bearer token. `redcount serve` answers
//! `GET /api/openapi.json` with it; the same text is committed as `openapi.json` at the
//! repository root (a test fails when the two differ), which the worker serves as a static
//! file. Needs `std` (the worker's wasm carries none of it).

use std::string::String;
use std::sync::OnceLock;
use std::vec::Vec;

use serde_json::{Map, Value as Json, json};

use crate::route::{ROUTES, RouteId, RouteSpec};

/// The document's text (pretty-printed JSON, a newline at the end), generated once.
pub fn document() -> &'static str {
    static TEXT: OnceLock<String> = OnceLock::new();
    TEXT.get_or_init(|| {
        let mut text = serde_json::to_string_pretty(&generate()).unwrap_or_default();
        text.push('\n');
        text
    })
}

/// Who may call a route.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    /// Anyone; the admin token too (beyond the public limits where there are some).
    Public,
    /// Only with the admin token.
    Admin,
    /// Anyone when the inbox policy says `"public": true`, else only the admin.
    Inbox,
}

/// What the document says of one route besides its row.
struct Doc {
    access: Access,
    /// The request body's schema (`None`: none read), and whether one is required.
    body: Option<(Json, bool)>,
    /// Query parameters: name, schema.
    query: Vec<(&'static str, Json)>,
    /// Success answers: status, schema.
    ok: Vec<(u16, Json)>,
    /// Statuses beyond those every route can answer.
    errors: &'static [u16],
    /// A decision route: its answers carry `RateLimit-Policy` and `RateLimit`, and a denial
    /// `Retry-After`; when Redis does not answer, its policy's declared failure mode.
    decides: bool,
    /// A write: Redis at `maxmemory` refuses it (507).
    write: bool,
    /// It takes an `Idempotency-Key` (every write but a grab, which is once per user anyway).
    key: bool,
}

fn int() -> Json {
    json!({"type": "integer"})
}

fn int_min(min: i64) -> Json {
    json!({"type": "integer", "minimum": min})
}

/// An integer in a request body: a JSON number, or a string holding a canonical decimal (for
/// clients that send large numbers as strings).
fn body_int(min: Option<i64>) -> Json {
    let number = match min {
        Some(m) => int_min(m),
        None => int(),
    };
    json!({"anyOf": [number, {"type": "string", "pattern": "^(0|-?[1-9][0-9]{0,18})$"}]})
}

fn opt_int() -> Json {
    json!({"type": ["integer", "null"]})
}

fn boolean() -> Json {
    json!({"type": "boolean"})
}

fn string() -> Json {
    json!({"type": "string"})
}

fn words(list: &[&str]) -> Json {
    json!({"type": "string", "enum": list})
}

fn id() -> Json {
    json!({"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"})
}

fn reference(name: &str) -> Json {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

/// An object with exactly these properties, the `required` ones always there.
fn object(props: &[(&str, Json)], required: &[&str]) -> Json {
    let mut p = Map::new();
    for (k, v) in props {
        p.insert((*k).into(), v.clone());
    }
    json!({"type": "object", "properties": p, "required": required, "additionalProperties": false})
}

/// An object whose every property is required.
fn record(props: &[(&str, Json)]) -> Json {
    let required: Vec<&str> = props.iter().map(|(k, _)| *k).collect();
    object(props, &required)
}

fn quota_answer() -> Json {
    object(
        &[
            ("allowed", boolean()),
            ("limit", int()),
            ("remaining", int()),
            ("reset_ms", int()),
            ("retry_after_ms", int()),
            ("cached", cached()),
            ("cache_ms", cache_ms()),
        ],
        &["allowed", "limit", "remaining", "reset_ms", "retry_after_ms"],
    )
}

/// `"cache_ms"`: how long a client may repeat a denial without asking (the typed client's
/// denial cache, in the caller's own isolate).
fn cache_ms() -> Json {
    json!({"type": "integer", "minimum": 1, "description": "on a denial that may be repeated: how long from now, in ms, a client may answer the same call with this denial without asking (the least of what is left of the policy's cache_denials_ms, a decision's the least of its parts', and of retry_after_ms); absent when it may not (cache_denials_ms 0, a semaphore part, an Idempotency-Key)"})
}

/// `"cached": true`: a denial repeated from the shell's memory (its times shrunk by the time
/// passed), for at most the policy's `cache_denials_ms`.
fn cached() -> Json {
    json!({"const": true, "description": "a denial repeated from the serving shell's memory, for at most the policy's cache_denials_ms and never past its retry_after_ms"})
}

fn semaphore_answer() -> Json {
    record(&[
        ("result", words(&["acquired", "renewed", "full", "released", "not_holder", "held", "ended", "never_held"])),
        ("holding", boolean()),
        ("in_use", int()),
        ("limit", int()),
        ("earliest_end_ms", opt_int()),
        ("lease_ms", int()),
        ("fencing_token", opt_int()),
    ])
}

fn level() -> Json {
    words(&["user", "tenant"])
}

/// A settle's `actual` or an extend's `used`: units per policy (at every level of it, or at
/// `level`).
fn units_list() -> Json {
    json!({
        "type": "array", "maxItems": redcount_core::ops::decision::MAX_PARTS,
        "items": object(&[("policy", id()), ("units", body_int(Some(0))), ("level", level())], &["policy", "units"]),
    })
}

/// A reservation's id: a sealed ticket (base64url), up to 8 parts long.
fn ticket() -> Json {
    json!({"type": "string", "pattern": "^[A-Za-z0-9_-]{1,128}$"})
}

fn empty_body() -> Json {
    object(&[], &[])
}

fn holder_body(check: bool) -> Json {
    let mut props = vec![("holder", id())];
    let mut required = vec!["holder"];
    if check {
        props.push(("fencing_token", body_int(Some(1))));
        required.push("fencing_token");
    }
    object(&props, &required)
}

fn doc(route: RouteId) -> Doc {
    use Access::*;
    let read = |ok: Json| Doc {
        access: Public,
        body: None,
        query: Vec::new(),
        ok: vec![(200, ok)],
        errors: &[],
        decides: false,
        write: false,
        key: false,
    };
    let write = |access: Access, body: Json, required: bool, ok: Json, errors: &'static [u16]| Doc {
        access,
        body: Some((body, required)),
        query: Vec::new(),
        ok: vec![(200, ok)],
        errors,
        decides: false,
        write: true,
        key: true,
    };
    let cost = || object(&[("cost", body_int(Some(1)))], &[]);
    match route {
        RouteId::Health => read(record(&[("ok", boolean()), ("rest", string()), ("redis", string())])),
        RouteId::Policies => {
            read(record(&[("policies", json!({"type": "object", "additionalProperties": reference("Policy")}))]))
        }
        RouteId::OpenApi => read(json!({"type": "object"})),
        RouteId::CounterGet => read(record(&[("value", int())])),
        RouteId::CounterAdd => write(
            Public,
            object(&[("delta", body_int(None))], &["delta"]),
            true,
            record(&[("value", int()), ("applied", int()), ("status", words(&["applied", "clamped", "rejected"]))]),
            &[403],
        ),
        RouteId::Claim => Doc {
            decides: true,
            ..write(Public, empty_body(), false, record(&[("claimed", boolean()), ("retry_after_ms", opt_int())]), &[])
        },
        RouteId::QuotaPeek | RouteId::QuotaPeekTenant => {
            Doc { query: vec![("cost", int_min(1))], decides: true, ..read(quota_answer()) }
        }
        RouteId::QuotaTake | RouteId::QuotaTakeTenant => {
            Doc { decides: true, ..write(Public, cost(), false, quota_answer(), &[403]) }
        }
        RouteId::QuotaReset | RouteId::QuotaResetTenant => {
            Doc { body: None, ..write(Admin, empty_body(), false, record(&[("reset", boolean())]), &[]) }
        }
        RouteId::QuotaRefund | RouteId::QuotaRefundTenant => {
            write(Admin, cost(), false, record(&[("refunded", int())]), &[])
        }
        RouteId::OverrideSet => write(
            Admin,
            object(
                &[
                    ("limit", body_int(Some(1))),
                    ("capacity", body_int(Some(1))),
                    ("burst", body_int(Some(1))),
                    ("ttl_ms", body_int(Some(1))),
                ],
                &[],
            ),
            true,
            record(&[
                ("policy", string()),
                ("subject", string()),
                ("limit", int()),
                ("ttl_ms", opt_int()),
                ("replaced", boolean()),
            ]),
            &[],
        ),
        RouteId::OverrideClear => {
            Doc { body: None, ..write(Admin, empty_body(), false, record(&[("cleared", boolean())]), &[]) }
        }
        RouteId::Decide | RouteId::DecideTenant => Doc {
            decides: true,
            ..write(
                Public,
                object(
                    &[
                        (
                            "parts",
                            json!({
                                "type": "array", "minItems": 1,
                                "maxItems": redcount_core::ops::decision::MAX_PARTS,
                                "items": {"oneOf": [
                                    object(&[("policy", id()), ("cost", body_int(Some(1))), ("level", level())], &["policy"]),
                                    object(&[("policy", id()), ("holder", id()), ("level", level())], &["policy", "holder"]),
                                ]},
                            }),
                        ),
                        ("peek", boolean()),
                    ],
                    &["parts"],
                ),
                true,
                reference("Decision"),
                &[403],
            )
        },
        RouteId::Reserve | RouteId::ReserveTenant => Doc {
            decides: true,
            ..write(
                Public,
                object(
                    &[
                        (
                            "parts",
                            json!({
                                "type": "array", "minItems": 1,
                                "maxItems": redcount_core::ops::decision::MAX_PARTS,
                                "items": {"oneOf": [
                                    object(
                                        &[
                                            ("policy", id()),
                                            ("units", body_int(Some(1))),
                                            ("level", level()),
                                            ("min_units", body_int(Some(1))),
                                        ],
                                        &["policy", "units"],
                                    ),
                                    object(&[("policy", id()), ("holder", id()), ("level", level())], &["policy", "holder"]),
                                ]},
                            }),
                        ),
                        ("lease_ms", body_int(Some(1))),
                        ("mode", words(&["all", "capped"])),
                        ("peek", boolean()),
                    ],
                    &["parts"],
                ),
                true,
                reference("Reservation"),
                &[403, 409],
            )
        },
        RouteId::Settle | RouteId::SettleTenant => {
            write(Public, object(&[("actual", units_list())], &["actual"]), true, reference("Settlement"), &[403, 409])
        }
        RouteId::Extend | RouteId::ExtendTenant => write(
            Public,
            object(&[("lease_ms", body_int(Some(1))), ("used", units_list())], &[]),
            false,
            reference("Settlement"),
            &[403, 409],
        ),
        RouteId::Release | RouteId::ReleaseTenant => {
            write(Public, empty_body(), false, reference("Settlement"), &[409])
        }
        RouteId::SemaphoreAcquire | RouteId::SemaphoreRenew | RouteId::SemaphoreRelease => {
            Doc { decides: true, ..write(Public, holder_body(false), true, semaphore_answer(), &[]) }
        }
        RouteId::SemaphoreCheck => {
            Doc { decides: true, ..write(Public, holder_body(true), true, semaphore_answer(), &[]) }
        }
        RouteId::InboxRead => Doc {
            access: Inbox,
            query: vec![("after", int_min(0)), ("limit", int_min(1))],
            ..read(record(&[(
                "messages",
                json!({"type": "array", "items": record(&[("id", int()), ("time", int()), ("body", string())])}),
            )]))
        },
        RouteId::InboxAppend => {
            let stored = record(&[("stored", boolean()), ("length", int())]);
            Doc {
                ok: vec![(200, stored.clone()), (201, stored)],
                ..write(
                    Inbox,
                    object(
                        &[
                            ("id", body_int(Some(0))),
                            ("body", json!({"type": "string", "maxLength": redcount_core::ops::inbox::MAX_BODY})),
                        ],
                        &["id", "body"],
                    ),
                    true,
                    json!({}),
                    &[],
                )
            }
        }
        RouteId::InboxTrim => {
            write(Inbox, empty_body(), false, record(&[("deleted", int()), ("newest_time", opt_int())]), &[])
        }
        RouteId::PacketCreate => Doc {
            ok: vec![(
                201,
                record(&[
                    ("id", string()),
                    ("policy", string()),
                    ("total_cents", int()),
                    ("count", int()),
                    ("expires_at_ms", int()),
                ]),
            )],
            ..write(
                Public,
                object(
                    &[
                        ("total_cents", body_int(Some(1))),
                        ("count", body_int(Some(1))),
                        ("policy", id()),
                        ("min_cents", body_int(Some(1))),
                    ],
                    &["total_cents", "count"],
                ),
                true,
                json!({}),
                &[403, 409],
            )
        },
        RouteId::PacketStatus => read(record(&[
            ("id", string()),
            ("total_cents", int()),
            ("count", int()),
            ("remaining", int()),
            ("claimed", int()),
            ("claimed_cents", int()),
            ("created_ms", int()),
            ("expires_ms", int()),
        ])),
        RouteId::PacketGrab => Doc {
            key: false,
            ..write(
                Public,
                object(&[("user", id())], &["user"]),
                true,
                object(
                    &[
                        ("outcome", words(&["won", "already", "empty"])),
                        ("amount_cents", int()),
                        ("amount", int()),
                        ("index", int()),
                        ("remaining", int()),
                    ],
                    &["outcome"],
                ),
                &[],
            )
        },
        RouteId::PacketGrabs => Doc {
            query: vec![("offset", int_min(0)), ("limit", int_min(1))],
            ..read(record(&[(
                "claims",
                json!({"type": "array", "items": record(&[
                    ("user", string()), ("amount_cents", int()), ("amount", int()), ("index", int()), ("at_ms", int()),
                ])}),
            )]))
        },
    }
}

/// Statuses every route can answer: bad input or path (400), a wrong token (401), an unknown
/// policy or object (404), a slow or large body (408, 413, from the shells), a server
/// misconfigured (500), Redis or the REST front failing or unreachable (502, 503).
const COMMON: &[u16] = &[400, 401, 404, 408, 413, 500, 502, 503];
/// Statuses of writes: the same `Idempotency-Key` with another request (422), Redis at
/// `maxmemory` (507).
const WRITES: &[u16] = &[422, 507];

fn error_text(status: u16) -> &'static str {
    match status {
        400 => {
            "Bad input: `field` names it (a body or query field, a path parameter, `path`, `body`, `Idempotency-Key`)"
        }
        401 => "A wrong token, or an admin action without the admin token",
        403 => "Beyond the policy's public limit: `field` names what (the admin token may exceed it)",
        404 => "No such policy (`field`: `policy`) or object",
        408 => "The request body did not arrive in time",
        409 => {
            "A conflict with what Redis holds: a red packet with this id exists, a reservation's id is in use, or its policies changed since it was made"
        }
        413 => "The body is larger than 16 KiB",
        422 => "This Idempotency-Key was used for another request",
        500 => "The server is misconfigured",
        502 => "Redis or the REST front answered something unexpected",
        503 => "Redis or the REST front did not answer; on a decision route, the policy's declared failure mode",
        507 => "Redis is out of memory: nothing was written",
        _ => "An error",
    }
}

fn header(description: &str, schema: Json) -> Json {
    json!({"description": description, "schema": schema})
}

/// The headers and error answers operations refer to.
fn shared(components: &mut Json) {
    components["headers"] = json!({
        "RateLimit-Policy": header(
            "The policy (each part's, for a decision): `\"name\";q=quota;w=window seconds`, `qu=\"concurrent-requests\"` for a semaphore (draft-ietf-httpapi-ratelimit-headers)",
            string(),
        ),
        "RateLimit": header("What is left: `\"name\";r=remaining;t=seconds until more`", string()),
        "Retry-After": header(
            "On a denied take or decision: seconds (rounded up) until a call of the same cost can pass",
            int_min(1),
        ),
        "Idempotent-Replayed": header(
            "`true` when this is the stored answer of an earlier request with the same Idempotency-Key",
            string(),
        ),
    });
    let mut responses = Map::new();
    let mut all: Vec<u16> = COMMON.iter().chain(WRITES).chain(&[403, 409]).copied().collect();
    all.sort_unstable();
    for status in all {
        responses.insert(
            status.to_string(),
            json!({"description": error_text(status), "content": {"application/json": {"schema": reference("Error")}}}),
        );
    }
    responses.insert(
        "Unavailable".into(),
        json!({
            "description": error_text(503),
            "content": {"application/json": {"schema": {"anyOf": [reference("Error"), reference("Degraded")]}}},
        }),
    );
    components["responses"] = Json::Object(responses);
}

fn operation(spec: &RouteSpec) -> Json {
    let d = doc(spec.id);
    let mut parameters: Vec<Json> = spec
        .params
        .iter()
        .map(|p| {
            let schema = if *p == "id" && spec.family() == "reservations" { ticket() } else { id() };
            let mut param = json!({"name": p, "in": "path", "required": true, "schema": schema});
            // A tenant's user has a second spelling, the subject route's, that no action word
            // of the path can shadow.
            if *p == "subject" && spec.tenant_row().is_some() {
                param["schema"] = json!({"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}(/[A-Za-z0-9_-]{1,64})?$"});
                param["description"] = json!("A subject, or a tenant's user as `TENANT/USER` (one segment, `TENANT%2FUSER`): the same call as the `{tenant}/{user}` route's, for any user name");
            }
            if *p == "user" && spec.params.contains(&"tenant") {
                param["description"] = json!("The tenant's user. A user named like a word of this path (`refund`) is reached only as `{tenant}%2F{user}`, one segment, which the client always sends");
            }
            param
        })
        .collect();
    for (name, schema) in &d.query {
        parameters.push(json!({"name": name, "in": "query", "required": false, "schema": schema}));
    }
    if d.key {
        parameters.push(json!({
            "name": "Idempotency-Key", "in": "header", "required": false,
            "description": "Stores the first answer for 24 h: a retry with the same key and request gets it again (with `Idempotent-Replayed: true`) instead of applying twice",
            "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[!-~]+$"},
        }));
    }
    let mut headers = Map::new();
    let names: &[&str] = match (d.decides, d.key) {
        (true, true) => &["RateLimit-Policy", "RateLimit", "Retry-After", "Idempotent-Replayed"],
        (true, false) => &["RateLimit-Policy", "RateLimit", "Retry-After"],
        (false, true) => &["Idempotent-Replayed"],
        (false, false) => &[],
    };
    for name in names {
        headers.insert((*name).into(), json!({ "$ref": format!("#/components/headers/{name}") }));
    }
    let mut responses = Map::new();
    for (status, schema) in &d.ok {
        let schema = if d.decides { json!({"anyOf": [schema, reference("Degraded")]}) } else { schema.clone() };
        responses.insert(
            status.to_string(),
            json!({
                "description": if *status == 201 { "Created" } else { "The answer" },
                "headers": headers,
                "content": {"application/json": {"schema": schema}},
            }),
        );
    }
    let mut statuses: Vec<u16> = COMMON.to_vec();
    if d.write {
        statuses.push(507);
    }
    if d.key {
        statuses.push(422);
    }
    statuses.extend_from_slice(d.errors);
    statuses.sort_unstable();
    for status in statuses {
        // A decision route's 503 may be its policy's declared failure mode.
        let name = if status == 503 && d.decides { "Unavailable".to_string() } else { status.to_string() };
        responses.insert(status.to_string(), json!({ "$ref": format!("#/components/responses/{name}") }));
    }
    let security = match d.access {
        Access::Public => json!([{}, {"admin": []}]),
        Access::Admin => json!([{"admin": []}]),
        Access::Inbox => json!([{}, {"admin": []}]),
    };
    let mut op = json!({
        "operationId": format!("{:?}", spec.id),
        "summary": spec.id.summary(),
        "tags": [spec.family()],
        "security": security,
        "responses": responses,
    });
    // The RPC binding's (and the npm client's) method for this call.
    if let Some(name) = spec.rpc() {
        op["x-rpc"] = json!(name);
    }
    if d.access == Access::Inbox {
        op["description"] =
            json!("Public when the inbox policy says `\"public\": true`; otherwise the admin token is required.");
    }
    if !parameters.is_empty() {
        op["parameters"] = Json::Array(parameters);
    }
    if let Some((schema, required)) = d.body {
        op["requestBody"] = json!({"required": required, "content": {"application/json": {"schema": schema}}});
    }
    op
}

fn components() -> Json {
    let part_quota = record(&[
        ("policy", string()),
        ("kind", words(&["quota"])),
        ("allowed", boolean()),
        ("limit", int()),
        ("remaining", int()),
        ("reset_ms", int()),
        ("retry_after_ms", int()),
    ]);
    let part_lease = record(&[
        ("policy", string()),
        ("kind", words(&["semaphore"])),
        ("allowed", boolean()),
        ("result", words(&["full", "acquired", "renewed", "ended", "held"])),
        ("in_use", int()),
        ("limit", int()),
        ("earliest_end_ms", opt_int()),
        ("retry_after_ms", int()),
        ("lease_ms", int()),
        ("fencing_token", opt_int()),
    ]);
    let level = || words(&["user", "tenant"]);
    let reserved_quota = record(&[
        ("policy", string()),
        ("level", level()),
        ("kind", words(&["quota"])),
        ("allowed", boolean()),
        ("limit", int()),
        ("remaining", int()),
        ("reset_ms", int()),
        ("retry_after_ms", int()),
        ("reserved", int()),
        ("reclaimed", int()),
    ]);
    let reserved_lease = record(&[
        ("policy", string()),
        ("level", level()),
        ("kind", words(&["semaphore"])),
        ("allowed", boolean()),
        ("result", words(&["full", "acquired", "held"])),
        ("in_use", int()),
        ("limit", int()),
        ("earliest_end_ms", opt_int()),
        ("retry_after_ms", int()),
        ("lease_ms", int()),
        ("fencing_token", opt_int()),
    ]);
    let settled_quota = record(&[
        ("policy", string()),
        ("level", level()),
        ("kind", words(&["quota"])),
        ("reserved", int()),
        ("actual", int()),
        ("refunded", int()),
        ("charged", int()),
        ("uncharged", int()),
        ("debt", int()),
        ("reclaimed", int()),
    ]);
    let settled_lease = record(&[
        ("policy", string()),
        ("level", level()),
        ("kind", words(&["semaphore"])),
        ("lease", words(&["released", "renewed", "ended"])),
    ]);
    let states = || words(&["open", "settled", "released", "expired"]);
    json!({
        "securitySchemes": {
            "admin": {
                "type": "http", "scheme": "bearer",
                "description": "The admin token (REDCOUNT_ADMIN_TOKEN): resets, refunds, overrides, private inboxes, and beyond the public limits. Send none for public access.",
            },
        },
        "schemas": {
            "Error": object(
                &[
                    ("error", string()),
                    ("field", string()),
                    // A write that ran but is not known durable (a replica wait that fell short).
                    ("durable", boolean()),
                    ("may_have_run", boolean()),
                ],
                &["error"],
            ),
            "Degraded": {
                "description": "Redis did not answer: the policy's declared failure mode (`on_unavailable`), never a silent pass",
                "type": "object",
                "properties": {
                    "allowed": boolean(), "claimed": boolean(), "holding": boolean(),
                    "degraded": {"const": true}, "reason": string(), "may_have_run": boolean(), "error": string(),
                },
                "required": ["degraded", "reason", "may_have_run"],
                "additionalProperties": false,
            },
            "Decision": object(
                &[
                    ("allowed", boolean()),
                    ("denied_by", json!({"type": ["string", "null"]})),
                    ("retry_after_ms", int()),
                    ("peek", boolean()),
                    ("parts", json!({"type": "array", "items": {"oneOf": [part_quota, part_lease]}})),
                    ("cached", cached()),
                    ("cache_ms", cache_ms()),
                ],
                &["allowed", "denied_by", "retry_after_ms", "peek", "parts"],
            ),
            "Reservation": record(&[
                ("allowed", boolean()),
                ("reservation", json!({"type": ["string", "null"]})),
                ("state", json!({"anyOf": [states(), {"type": "null"}]})),
                ("expires_ms", opt_int()),
                ("denied_by", json!({"type": ["string", "null"]})),
                ("retry_after_ms", int()),
                ("peek", boolean()),
                ("parts", json!({"type": "array", "items": {"oneOf": [reserved_quota, reserved_lease]}})),
            ]),
            "Settlement": record(&[
                ("reservation", string()),
                ("state", states()),
                ("already_settled", boolean()),
                ("expires_ms", int()),
                ("parts", json!({"type": "array", "items": {"oneOf": [settled_quota, settled_lease]}})),
            ]),
            "Policy": {
                "type": "object",
                "properties": {"kind": words(&["quota", "semaphore", "counter", "claim", "redpackets", "inbox"])},
                "required": ["kind"],
            },
        },
    })
}

fn generate() -> Json {
    let mut components = components();
    shared(&mut components);
    let mut paths = Map::new();
    for spec in ROUTES {
        let item = paths.entry(spec.path).or_insert_with(|| json!({}));
        item[spec.method.to_ascii_lowercase()] = operation(spec);
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "redcount",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Atomic counting primitives over Redis: quotas, semaphores, counters, claims, compound decisions, inboxes, red packets. Generated from redcount-api's route table.",
        },
        "paths": paths,
        "components": components,
    })
}

// Generated from openapi.json by scripts/generate.mjs: do not edit (the build checks it).

/** The `Decision` schema of the API. */
export type Decision = {
  allowed: boolean;
  /** on a denial that may be repeated: how long from now, in ms, a client may answer the same call with this denial without asking (the least of what is left of the policy's cache_denials_ms, a decision's the least of its parts', and of retry_after_ms); absent when it may not (cache_denials_ms 0, a semaphore part, an Idempotency-Key) */
  cache_ms?: number;
  /** a denial repeated from the serving shell's memory, for at most the policy's cache_denials_ms and never past its retry_after_ms */
  cached?: true;
  denied_by: string | null;
  parts: ({
    allowed: boolean;
    kind: "quota";
    limit: number;
    policy: string;
    remaining: number;
    reset_ms: number;
    retry_after_ms: number;
  } | ({
    allowed: boolean;
    earliest_end_ms: number | null;
    fencing_token: number | null;
    in_use: number;
    kind: "semaphore";
    lease_ms: number;
    limit: number;
    policy: string;
    result: "full" | "acquired" | "renewed" | "ended" | "held";
    retry_after_ms: number;
  }))[];
  peek: boolean;
  retry_after_ms: number;
};

/** Redis did not answer: the policy's declared failure mode (`on_unavailable`), never a silent pass */
export type Degraded = {
  allowed?: boolean;
  claimed?: boolean;
  degraded: true;
  error?: string;
  holding?: boolean;
  may_have_run: boolean;
  reason: string;
};

/** The `Error` schema of the API. */
export type ErrorBody = {
  durable?: boolean;
  error: string;
  field?: string;
  may_have_run?: boolean;
};

/** The `Policy` schema of the API. */
export type Policy = {
  kind: "quota" | "semaphore" | "counter" | "claim" | "redpackets" | "inbox";
};

/** The `Reservation` schema of the API. */
export type Reservation = {
  allowed: boolean;
  denied_by: string | null;
  expires_ms: number | null;
  parts: (({
    allowed: boolean;
    kind: "quota";
    level: "user" | "tenant";
    limit: number;
    policy: string;
    reclaimed: number;
    remaining: number;
    reserved: number;
    reset_ms: number;
    retry_after_ms: number;
  }) | ({
    allowed: boolean;
    earliest_end_ms: number | null;
    fencing_token: number | null;
    in_use: number;
    kind: "semaphore";
    lease_ms: number;
    level: "user" | "tenant";
    limit: number;
    policy: string;
    result: "full" | "acquired" | "held";
    retry_after_ms: number;
  }))[];
  peek: boolean;
  reservation: string | null;
  retry_after_ms: number;
  state: ("open" | "settled" | "released" | "expired") | null;
};

/** The `Settlement` schema of the API. */
export type Settlement = {
  already_settled: boolean;
  expires_ms: number;
  parts: (({
    actual: number;
    charged: number;
    debt: number;
    kind: "quota";
    level: "user" | "tenant";
    policy: string;
    reclaimed: number;
    refunded: number;
    reserved: number;
    uncharged: number;
  }) | ({
    kind: "semaphore";
    lease: "released" | "renewed" | "ended";
    level: "user" | "tenant";
    policy: string;
  }))[];
  reservation: string;
  state: "open" | "settled" | "released" | "expired";
};

/** Call options: an Idempotency-Key makes a write's retry answer what its first call answered. */
export interface CallOptions {
  idempotencyKey?: string;
}

/** The headers an answer came with (RateLimit-Policy, RateLimit, Retry-After, Idempotent-Replayed). */
export type WithHeaders<T> = T & { headers?: { [name: string]: string } };

/** The fields of `claim`. */
export type ClaimInput = Record<string, never>;
/** What `claim` answers. */
export type ClaimAnswer = ({
  claimed: boolean;
  retry_after_ms: number | null;
}) | Degraded;

/** The fields of `getCounter`. */
export type CounterGetInput = Record<string, never>;
/** What `getCounter` answers. */
export type CounterGetAnswer = {
  value: number;
};

/** The fields of `addCounter`. */
export type CounterAddInput = {
  delta: number | string;
};
/** What `addCounter` answers. */
export type CounterAddAnswer = {
  applied: number;
  status: "applied" | "clamped" | "rejected";
  value: number;
};

/** The fields of `decide`. */
export type DecideInput = {
  parts: (({
    cost?: number | string;
    level?: "user" | "tenant";
    policy: string;
  }) | ({
    holder: string;
    level?: "user" | "tenant";
    policy: string;
  }))[];
  peek?: boolean;
};
/** What `decide` answers. */
export type DecideAnswer = Decision | Degraded;

/** The fields of `decideTenant`. */
export type DecideTenantInput = {
  parts: (({
    cost?: number | string;
    level?: "user" | "tenant";
    policy: string;
  }) | ({
    holder: string;
    level?: "user" | "tenant";
    policy: string;
  }))[];
  peek?: boolean;
};
/** What `decideTenant` answers. */
export type DecideTenantAnswer = Decision | Degraded;

/** The fields of `health`. */
export type HealthInput = Record<string, never>;
/** What `health` answers. */
export type HealthAnswer = {
  ok: boolean;
  redis: string;
  rest: string;
};

/** The fields of `readInbox`. */
export type InboxReadInput = {
  after?: number;
  limit?: number;
};
/** What `readInbox` answers. */
export type InboxReadAnswer = {
  messages: {
    body: string;
    id: number;
    time: number;
  }[];
};

/** The fields of `appendInbox`. */
export type InboxAppendInput = {
  body: string;
  id: number | string;
};
/** What `appendInbox` answers. */
export type InboxAppendAnswer = {
  length: number;
  stored: boolean;
};

/** The fields of `trimInbox`. */
export type InboxTrimInput = Record<string, never>;
/** What `trimInbox` answers. */
export type InboxTrimAnswer = {
  deleted: number;
  newest_time: number | null;
};

/** The fields of `clearOverride`. */
export type OverrideClearInput = Record<string, never>;
/** What `clearOverride` answers. */
export type OverrideClearAnswer = {
  cleared: boolean;
};

/** The fields of `setOverride`. */
export type OverrideSetInput = {
  burst?: number | string;
  capacity?: number | string;
  limit?: number | string;
  ttl_ms?: number | string;
};
/** What `setOverride` answers. */
export type OverrideSetAnswer = {
  limit: number;
  policy: string;
  replaced: boolean;
  subject: string;
  ttl_ms: number | null;
};

/** The fields of `policies`. */
export type PoliciesInput = Record<string, never>;
/** What `policies` answers. */
export type PoliciesAnswer = {
  policies: { [name: string]: Policy };
};

/** The fields of `reset`. */
export type QuotaResetInput = Record<string, never>;
/** What `reset` answers. */
export type QuotaResetAnswer = {
  reset: boolean;
};

/** The fields of `peek`. */
export type QuotaPeekInput = {
  cost?: number;
};
/** What `peek` answers. */
export type QuotaPeekAnswer = {
  allowed: boolean;
  /** on a denial that may be repeated: how long from now, in ms, a client may answer the same call with this denial without asking (the least of what is left of the policy's cache_denials_ms, a decision's the least of its parts', and of retry_after_ms); absent when it may not (cache_denials_ms 0, a semaphore part, an Idempotency-Key) */
  cache_ms?: number;
  /** a denial repeated from the serving shell's memory, for at most the policy's cache_denials_ms and never past its retry_after_ms */
  cached?: true;
  limit: number;
  remaining: number;
  reset_ms: number;
  retry_after_ms: number;
} | Degraded;

/** The fields of `take`. */
export type QuotaTakeInput = {
  cost?: number | string;
};
/** What `take` answers. */
export type QuotaTakeAnswer = {
  allowed: boolean;
  /** on a denial that may be repeated: how long from now, in ms, a client may answer the same call with this denial without asking (the least of what is left of the policy's cache_denials_ms, a decision's the least of its parts', and of retry_after_ms); absent when it may not (cache_denials_ms 0, a semaphore part, an Idempotency-Key) */
  cache_ms?: number;
  /** a denial repeated from the serving shell's memory, for at most the policy's cache_denials_ms and never past its retry_after_ms */
  cached?: true;
  limit: number;
  remaining: number;
  reset_ms: number;
  retry_after_ms: number;
} | Degraded;

/** The fields of `refund`. */
export type QuotaRefundInput = {
  cost?: number | string;
};
/** What `refund` answers. */
export type QuotaRefundAnswer = {
  refunded: number;
};

/** The fields of `resetTenant`. */
export type QuotaResetTenantInput = Record<string, never>;
/** What `resetTenant` answers. */
export type QuotaResetTenantAnswer = {
  reset: boolean;
};

/** The fields of `peekTenant`. */
export type QuotaPeekTenantInput = {
  cost?: number;
};
/** What `peekTenant` answers. */
export type QuotaPeekTenantAnswer = {
  allowed: boolean;
  /** on a denial that may be repeated: how long from now, in ms, a client may answer the same call with this denial without asking (the least of what is left of the policy's cache_denials_ms, a decision's the least of its parts', and of retry_after_ms); absent when it may not (cache_denials_ms 0, a semaphore part, an Idempotency-Key) */
  cache_ms?: number;
  /** a denial repeated from the serving shell's memory, for at most the policy's cache_denials_ms and never past its retry_after_ms */
  cached?: true;
  limit: number;
  remaining: number;
  reset_ms: number;
  retry_after_ms: number;
} | Degraded;

/** The fields of `takeTenant`. */
export type QuotaTakeTenantInput = {
  cost?: number | string;
};
/** What `takeTenant` answers. */
export type QuotaTakeTenantAnswer = {
  allowed: boolean;
  /** on a denial that may be repeated: how long from now, in ms, a client may answer the same call with this denial without asking (the least of what is left of the policy's cache_denials_ms, a decision's the least of its parts', and of retry_after_ms); absent when it may not (cache_denials_ms 0, a semaphore part, an Idempotency-Key) */
  cache_ms?: number;
  /** a denial repeated from the serving shell's memory, for at most the policy's cache_denials_ms and never past its retry_after_ms */
  cached?: true;
  limit: number;
  remaining: number;
  reset_ms: number;
  retry_after_ms: number;
} | Degraded;

/** The fields of `refundTenant`. */
export type QuotaRefundTenantInput = {
  cost?: number | string;
};
/** What `refundTenant` answers. */
export type QuotaRefundTenantAnswer = {
  refunded: number;
};

/** The fields of `createPacket`. */
export type PacketCreateInput = {
  count: number | string;
  min_cents?: number | string;
  policy?: string;
  total_cents: number | string;
};
/** What `createPacket` answers. */
export type PacketCreateAnswer = {
  count: number;
  expires_at_ms: number;
  id: string;
  policy: string;
  total_cents: number;
};

/** The fields of `packetStatus`. */
export type PacketStatusInput = Record<string, never>;
/** What `packetStatus` answers. */
export type PacketStatusAnswer = {
  claimed: number;
  claimed_cents: number;
  count: number;
  created_ms: number;
  expires_ms: number;
  id: string;
  remaining: number;
  total_cents: number;
};

/** The fields of `packetGrabs`. */
export type PacketGrabsInput = {
  offset?: number;
  limit?: number;
};
/** What `packetGrabs` answers. */
export type PacketGrabsAnswer = {
  claims: {
    amount: number;
    amount_cents: number;
    at_ms: number;
    index: number;
    user: string;
  }[];
};

/** The fields of `grab`. */
export type PacketGrabInput = {
  user: string;
};
/** What `grab` answers. */
export type PacketGrabAnswer = {
  amount?: number;
  amount_cents?: number;
  index?: number;
  outcome: "won" | "already" | "empty";
  remaining?: number;
};

/** The fields of `reserve`. */
export type ReserveInput = {
  lease_ms?: number | string;
  mode?: "all" | "capped";
  parts: (({
    level?: "user" | "tenant";
    min_units?: number | string;
    policy: string;
    units: number | string;
  }) | ({
    holder: string;
    level?: "user" | "tenant";
    policy: string;
  }))[];
  peek?: boolean;
};
/** What `reserve` answers. */
export type ReserveAnswer = Reservation | Degraded;

/** The fields of `extendReservation`. */
export type ExtendInput = {
  lease_ms?: number | string;
  used?: ({
    level?: "user" | "tenant";
    policy: string;
    units: number | string;
  })[];
};
/** What `extendReservation` answers. */
export type ExtendAnswer = Settlement;

/** The fields of `releaseReservation`. */
export type ReleaseInput = Record<string, never>;
/** What `releaseReservation` answers. */
export type ReleaseAnswer = Settlement;

/** The fields of `settle`. */
export type SettleInput = {
  actual: ({
    level?: "user" | "tenant";
    policy: string;
    units: number | string;
  })[];
};
/** What `settle` answers. */
export type SettleAnswer = Settlement;

/** The fields of `reserveTenant`. */
export type ReserveTenantInput = {
  lease_ms?: number | string;
  mode?: "all" | "capped";
  parts: (({
    level?: "user" | "tenant";
    min_units?: number | string;
    policy: string;
    units: number | string;
  }) | ({
    holder: string;
    level?: "user" | "tenant";
    policy: string;
  }))[];
  peek?: boolean;
};
/** What `reserveTenant` answers. */
export type ReserveTenantAnswer = Reservation | Degraded;

/** The fields of `extendReservationTenant`. */
export type ExtendTenantInput = {
  lease_ms?: number | string;
  used?: ({
    level?: "user" | "tenant";
    policy: string;
    units: number | string;
  })[];
};
/** What `extendReservationTenant` answers. */
export type ExtendTenantAnswer = Settlement;

/** The fields of `releaseReservationTenant`. */
export type ReleaseTenantInput = Record<string, never>;
/** What `releaseReservationTenant` answers. */
export type ReleaseTenantAnswer = Settlement;

/** The fields of `settleTenant`. */
export type SettleTenantInput = {
  actual: ({
    level?: "user" | "tenant";
    policy: string;
    units: number | string;
  })[];
};
/** What `settleTenant` answers. */
export type SettleTenantAnswer = Settlement;

/** The fields of `acquire`. */
export type SemaphoreAcquireInput = {
  holder: string;
};
/** What `acquire` answers. */
export type SemaphoreAcquireAnswer = ({
  earliest_end_ms: number | null;
  fencing_token: number | null;
  holding: boolean;
  in_use: number;
  lease_ms: number;
  limit: number;
  result: "acquired" | "renewed" | "full" | "released" | "not_holder" | "held" | "ended" | "never_held";
}) | Degraded;

/** The fields of `check`. */
export type SemaphoreCheckInput = {
  fencing_token: number | string;
  holder: string;
};
/** What `check` answers. */
export type SemaphoreCheckAnswer = ({
  earliest_end_ms: number | null;
  fencing_token: number | null;
  holding: boolean;
  in_use: number;
  lease_ms: number;
  limit: number;
  result: "acquired" | "renewed" | "full" | "released" | "not_holder" | "held" | "ended" | "never_held";
}) | Degraded;

/** The fields of `release`. */
export type SemaphoreReleaseInput = {
  holder: string;
};
/** What `release` answers. */
export type SemaphoreReleaseAnswer = ({
  earliest_end_ms: number | null;
  fencing_token: number | null;
  holding: boolean;
  in_use: number;
  lease_ms: number;
  limit: number;
  result: "acquired" | "renewed" | "full" | "released" | "not_holder" | "held" | "ended" | "never_held";
}) | Degraded;

/** The fields of `renew`. */
export type SemaphoreRenewInput = {
  holder: string;
};
/** What `renew` answers. */
export type SemaphoreRenewAnswer = ({
  earliest_end_ms: number | null;
  fencing_token: number | null;
  holding: boolean;
  in_use: number;
  lease_ms: number;
  limit: number;
  result: "acquired" | "renewed" | "full" | "released" | "not_holder" | "held" | "ended" | "never_held";
}) | Degraded;

/** Every method: its HTTP route, path parameters (the arguments before the fields) and whether its fields go in the query. */
export const routes = {
  claim: { method: "POST", path: "/api/claims/{policy}/{subject}", params: ["policy","subject"], query: false },
  getCounter: { method: "GET", path: "/api/counters/{policy}/{subject}", params: ["policy","subject"], query: true },
  addCounter: { method: "POST", path: "/api/counters/{policy}/{subject}", params: ["policy","subject"], query: false },
  decide: { method: "POST", path: "/api/decisions/{subject}", params: ["subject"], query: false },
  decideTenant: { method: "POST", path: "/api/decisions/{tenant}/{user}", params: ["tenant","user"], query: false },
  health: { method: "GET", path: "/api/health", params: [], query: true },
  readInbox: { method: "GET", path: "/api/inbox/{user}/messages", params: ["user"], query: true },
  appendInbox: { method: "POST", path: "/api/inbox/{user}/messages", params: ["user"], query: false },
  trimInbox: { method: "POST", path: "/api/inbox/{user}/trim", params: ["user"], query: false },
  clearOverride: { method: "DELETE", path: "/api/overrides/{policy}/{subject}", params: ["policy","subject"], query: false },
  setOverride: { method: "PUT", path: "/api/overrides/{policy}/{subject}", params: ["policy","subject"], query: false },
  policies: { method: "GET", path: "/api/policies", params: [], query: true },
  reset: { method: "DELETE", path: "/api/quotas/{policy}/{subject}", params: ["policy","subject"], query: false },
  peek: { method: "GET", path: "/api/quotas/{policy}/{subject}", params: ["policy","subject"], query: true },
  take: { method: "POST", path: "/api/quotas/{policy}/{subject}", params: ["policy","subject"], query: false },
  refund: { method: "POST", path: "/api/quotas/{policy}/{subject}/refund", params: ["policy","subject"], query: false },
  resetTenant: { method: "DELETE", path: "/api/quotas/{policy}/{tenant}/{user}", params: ["policy","tenant","user"], query: false },
  peekTenant: { method: "GET", path: "/api/quotas/{policy}/{tenant}/{user}", params: ["policy","tenant","user"], query: true },
  takeTenant: { method: "POST", path: "/api/quotas/{policy}/{tenant}/{user}", params: ["policy","tenant","user"], query: false },
  refundTenant: { method: "POST", path: "/api/quotas/{policy}/{tenant}/{user}/refund", params: ["policy","tenant","user"], query: false },
  createPacket: { method: "POST", path: "/api/redpackets", params: [], query: false },
  packetStatus: { method: "GET", path: "/api/redpackets/{id}", params: ["id"], query: true },
  packetGrabs: { method: "GET", path: "/api/redpackets/{id}/claims", params: ["id"], query: true },
  grab: { method: "POST", path: "/api/redpackets/{id}/grab", params: ["id"], query: false },
  reserve: { method: "POST", path: "/api/reservations/{subject}", params: ["subject"], query: false },
  extendReservation: { method: "POST", path: "/api/reservations/{subject}/{id}/extend", params: ["subject","id"], query: false },
  releaseReservation: { method: "POST", path: "/api/reservations/{subject}/{id}/release", params: ["subject","id"], query: false },
  settle: { method: "POST", path: "/api/reservations/{subject}/{id}/settle", params: ["subject","id"], query: false },
  reserveTenant: { method: "POST", path: "/api/reservations/{tenant}/{user}", params: ["tenant","user"], query: false },
  extendReservationTenant: { method: "POST", path: "/api/reservations/{tenant}/{user}/{id}/extend", params: ["tenant","user","id"], query: false },
  releaseReservationTenant: { method: "POST", path: "/api/reservations/{tenant}/{user}/{id}/release", params: ["tenant","user","id"], query: false },
  settleTenant: { method: "POST", path: "/api/reservations/{tenant}/{user}/{id}/settle", params: ["tenant","user","id"], query: false },
  acquire: { method: "POST", path: "/api/semaphores/{policy}/{name}/acquire", params: ["policy","name"], query: false },
  check: { method: "POST", path: "/api/semaphores/{policy}/{name}/check", params: ["policy","name"], query: false },
  release: { method: "POST", path: "/api/semaphores/{policy}/{name}/release", params: ["policy","name"], query: false },
  renew: { method: "POST", path: "/api/semaphores/{policy}/{name}/renew", params: ["policy","name"], query: false },
} as const;

/** The method names. */
export type MethodName = keyof typeof routes;

/** The methods, as the binding and the HTTP API both answer them. */
export interface Methods {
  /** Takes the once-per-window claim. `POST /api/claims/{policy}/{subject}` */
  claim(policy: string, subject: string, input?: ClaimInput, options?: CallOptions): Promise<WithHeaders<ClaimAnswer>>;
  /** A counter's value. `GET /api/counters/{policy}/{subject}` */
  getCounter(policy: string, subject: string, input?: CounterGetInput, options?: CallOptions): Promise<WithHeaders<CounterGetAnswer>>;
  /** Adds `delta` to a counter, within its bounds. `POST /api/counters/{policy}/{subject}` */
  addCounter(policy: string, subject: string, input?: CounterAddInput, options?: CallOptions): Promise<WithHeaders<CounterAddAnswer>>;
  /** Quota and semaphore policies of one subject decided at once, all or nothing. `POST /api/decisions/{subject}` */
  decide(subject: string, input?: DecideInput, options?: CallOptions): Promise<WithHeaders<DecideAnswer>>;
  /** A tenant's user's and the tenant's own quota and semaphore policies decided at once. `POST /api/decisions/{tenant}/{user}` */
  decideTenant(tenant: string, user: string, input?: DecideTenantInput, options?: CallOptions): Promise<WithHeaders<DecideTenantAnswer>>;
  /** Whether Redis answers (a `PING` through the shell's path to it). `GET /api/health` */
  health(input?: HealthInput, options?: CallOptions): Promise<WithHeaders<HealthAnswer>>;
  /** A page of a user's inbox. `GET /api/inbox/{user}/messages` */
  readInbox(user: string, input?: InboxReadInput, options?: CallOptions): Promise<WithHeaders<InboxReadAnswer>>;
  /** Appends a message to a user's inbox (once per id). `POST /api/inbox/{user}/messages` */
  appendInbox(user: string, input?: InboxAppendInput, options?: CallOptions): Promise<WithHeaders<InboxAppendAnswer>>;
  /** Drops a user's old messages. `POST /api/inbox/{user}/trim` */
  trimInbox(user: string, input?: InboxTrimInput, options?: CallOptions): Promise<WithHeaders<InboxTrimAnswer>>;
  /** Clears a subject's override (admin). `DELETE /api/overrides/{policy}/{subject}` */
  clearOverride(policy: string, subject: string, input?: OverrideClearInput, options?: CallOptions): Promise<WithHeaders<OverrideClearAnswer>>;
  /** Sets a subject's own size of a quota or semaphore policy (admin). `PUT /api/overrides/{policy}/{subject}` */
  setOverride(policy: string, subject: string, input?: OverrideSetInput, options?: CallOptions): Promise<WithHeaders<OverrideSetAnswer>>;
  /** The configured policies (public: they hold no secret). `GET /api/policies` */
  policies(input?: PoliciesInput, options?: CallOptions): Promise<WithHeaders<PoliciesAnswer>>;
  /** Forgets a subject's use of a quota (admin). `DELETE /api/quotas/{policy}/{subject}` */
  reset(policy: string, subject: string, input?: QuotaResetInput, options?: CallOptions): Promise<WithHeaders<QuotaResetAnswer>>;
  /** Whether a take of `cost` would pass, taking nothing. `GET /api/quotas/{policy}/{subject}` */
  peek(policy: string, subject: string, input?: QuotaPeekInput, options?: CallOptions): Promise<WithHeaders<QuotaPeekAnswer>>;
  /** Takes `cost` units of a quota when they are there. `POST /api/quotas/{policy}/{subject}` */
  take(policy: string, subject: string, input?: QuotaTakeInput, options?: CallOptions): Promise<WithHeaders<QuotaTakeAnswer>>;
  /** Gives units back, never above the limit (admin). `POST /api/quotas/{policy}/{subject}/refund` */
  refund(policy: string, subject: string, input?: QuotaRefundInput, options?: CallOptions): Promise<WithHeaders<QuotaRefundAnswer>>;
  /** Forgets a tenant's user's use of a quota (admin). `DELETE /api/quotas/{policy}/{tenant}/{user}` */
  resetTenant(policy: string, tenant: string, user: string, input?: QuotaResetTenantInput, options?: CallOptions): Promise<WithHeaders<QuotaResetTenantAnswer>>;
  /** Whether a take of `cost` would pass, taking nothing: a user of a tenant. `GET /api/quotas/{policy}/{tenant}/{user}` */
  peekTenant(policy: string, tenant: string, user: string, input?: QuotaPeekTenantInput, options?: CallOptions): Promise<WithHeaders<QuotaPeekTenantAnswer>>;
  /** Takes `cost` units of a quota when they are there: a user of a tenant. `POST /api/quotas/{policy}/{tenant}/{user}` */
  takeTenant(policy: string, tenant: string, user: string, input?: QuotaTakeTenantInput, options?: CallOptions): Promise<WithHeaders<QuotaTakeTenantAnswer>>;
  /** Gives a tenant's user units back, never above the limit (admin). `POST /api/quotas/{policy}/{tenant}/{user}/refund` */
  refundTenant(policy: string, tenant: string, user: string, input?: QuotaRefundTenantInput, options?: CallOptions): Promise<WithHeaders<QuotaRefundTenantAnswer>>;
  /** Creates a red packet: a total split into shares. `POST /api/redpackets` */
  createPacket(input?: PacketCreateInput, options?: CallOptions): Promise<WithHeaders<PacketCreateAnswer>>;
  /** A red packet's status. `GET /api/redpackets/{id}` */
  packetStatus(id: string, input?: PacketStatusInput, options?: CallOptions): Promise<WithHeaders<PacketStatusAnswer>>;
  /** A page of a red packet's grabs. `GET /api/redpackets/{id}/claims` */
  packetGrabs(id: string, input?: PacketGrabsInput, options?: CallOptions): Promise<WithHeaders<PacketGrabsAnswer>>;
  /** Grabs a share of a red packet (once per user). `POST /api/redpackets/{id}/grab` */
  grab(id: string, input?: PacketGrabInput, options?: CallOptions): Promise<WithHeaders<PacketGrabAnswer>>;
  /** Reserves units of quotas (and leases of semaphores) of one subject, all or nothing (or capped), until the reservation is settled at what was used. `POST /api/reservations/{subject}` */
  reserve(subject: string, input?: ReserveInput, options?: CallOptions): Promise<WithHeaders<ReserveAnswer>>;
  /** Renews a reservation's lease, charging the units used so far. `POST /api/reservations/{subject}/{id}/extend` */
  extendReservation(subject: string, id: string, input?: ExtendInput, options?: CallOptions): Promise<WithHeaders<ExtendAnswer>>;
  /** Cancels a reservation: every unit not reported used back, its leases freed. `POST /api/reservations/{subject}/{id}/release` */
  releaseReservation(subject: string, id: string, input?: ReleaseInput, options?: CallOptions): Promise<WithHeaders<ReleaseAnswer>>;
  /** Settles a reservation at the units used: the difference back, or the overrun charged. `POST /api/reservations/{subject}/{id}/settle` */
  settle(subject: string, id: string, input?: SettleInput, options?: CallOptions): Promise<WithHeaders<SettleAnswer>>;
  /** Reserves for a user of a tenant, at either level. `POST /api/reservations/{tenant}/{user}` */
  reserveTenant(tenant: string, user: string, input?: ReserveTenantInput, options?: CallOptions): Promise<WithHeaders<ReserveTenantAnswer>>;
  /** Renews a tenant's user's reservation. `POST /api/reservations/{tenant}/{user}/{id}/extend` */
  extendReservationTenant(tenant: string, user: string, id: string, input?: ExtendTenantInput, options?: CallOptions): Promise<WithHeaders<ExtendTenantAnswer>>;
  /** Cancels a tenant's user's reservation. `POST /api/reservations/{tenant}/{user}/{id}/release` */
  releaseReservationTenant(tenant: string, user: string, id: string, input?: ReleaseTenantInput, options?: CallOptions): Promise<WithHeaders<ReleaseTenantAnswer>>;
  /** Settles a tenant's user's reservation. `POST /api/reservations/{tenant}/{user}/{id}/settle` */
  settleTenant(tenant: string, user: string, id: string, input?: SettleTenantInput, options?: CallOptions): Promise<WithHeaders<SettleTenantAnswer>>;
  /** Takes a lease of a semaphore when one is free. `POST /api/semaphores/{policy}/{name}/acquire` */
  acquire(policy: string, name: string, input?: SemaphoreAcquireInput, options?: CallOptions): Promise<WithHeaders<SemaphoreAcquireAnswer>>;
  /** Whether a holder still holds its lease under a fencing token. `POST /api/semaphores/{policy}/{name}/check` */
  check(policy: string, name: string, input?: SemaphoreCheckInput, options?: CallOptions): Promise<WithHeaders<SemaphoreCheckAnswer>>;
  /** Gives a lease back. `POST /api/semaphores/{policy}/{name}/release` */
  release(policy: string, name: string, input?: SemaphoreReleaseInput, options?: CallOptions): Promise<WithHeaders<SemaphoreReleaseAnswer>>;
  /** Extends a held lease. `POST /api/semaphores/{policy}/{name}/renew` */
  renew(policy: string, name: string, input?: SemaphoreRenewInput, options?: CallOptions): Promise<WithHeaders<SemaphoreRenewAnswer>>;
}

//! Runs core operations through an Upstash-compatible REST front (Upstash, redcount-rest).

use std::time::Duration;

use redcount_core::rest::{self, ENCODING_BASE64, ENCODING_HEADER, Encoding, RestError};
use redcount_core::{Command, Operation, Value};

use crate::{Error, Transport};

/// A REST endpoint and its token.
#[derive(Clone)]
pub struct Rest {
    http: reqwest::Client,
    url: String,
    token: String,
}

impl std::fmt::Debug for Rest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token.
        f.debug_struct("Rest").field("url", &self.url).finish_non_exhaustive()
    }
}

impl Rest {
    /// A client of `url` with bearer `token`; each request gives up after `timeout`.
    pub fn new(url: &str, token: &str, timeout: Duration) -> Result<Self, Error> {
        // https:// needs a rustls provider; installing it here spares every caller the step.
        crate::tls::install_crypto_provider();
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .pool_max_idle_per_host(256)
            .build()
            .map_err(|e| Error::Config(format!("REST client: {e}")))?;
        Ok(Rest { http, url: url.trim_end_matches('/').to_string(), token: token.to_string() })
    }

    /// POSTs a REST body to `/` and returns the status and body, undecoded.
    pub async fn post(&self, body: String) -> Result<(u16, Vec<u8>), Error> {
        let resp = self
            .http
            .post(format!("{}/", self.url))
            .bearer_auth(&self.token)
            .header(ENCODING_HEADER, ENCODING_BASE64)
            .header("Content-Type", "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| self.transport(&e))?;
        let status = resp.status().as_u16();
        // Read as it arrives and refused past the bound: a broken or hostile front (or tampered
        // plain HTTP) must not make this process hold whatever it sends.
        let too_large =
            || Error::Protocol(format!("REST front {}: reply larger than {} bytes", self.url, rest::MAX_REPLY));
        if resp.content_length().is_some_and(|n| n > rest::MAX_REPLY as u64) {
            return Err(too_large());
        }
        let mut resp = resp;
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| self.transport(&e))? {
            if body.len() + chunk.len() > rest::MAX_REPLY {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        Ok((status, body))
    }

    /// Sends one command (`POST /`, replies base64-encoded so binary values survive).
    pub async fn send(&self, command: &Command) -> Result<Value, Error> {
        let (status, body) = self.post(command.to_rest_body()).await?;
        rest::decode_reply(status, &body, Encoding::Base64).map_err(|e| match e {
            RestError::Reply(r) => Error::Redis(r),
            RestError::Unauthorized(m) => Error::Unauthorized(m),
            // The front could not finish the call (Redis unreachable, lost, or slow): unless
            // it says otherwise, assume the command may have run.
            RestError::Unavailable(s, m) => Error::Transport(Transport {
                may_have_run: true,
                timed_out: s == 504,
                detail: format!("REST front {}: HTTP {s}: {m}", self.url),
            }),
            other => Error::Protocol(other.to_string()),
        })
    }

    /// What a failed HTTP exchange says about the command: a refused connection sent
    /// nothing; anything later may have reached Redis.
    fn transport(&self, e: &reqwest::Error) -> Error {
        // reqwest's own text is "error sending request"; the reason (a certificate not
        // trusted, a refused connection) is in its sources.
        let mut detail = format!("REST front {}: {e}", self.url);
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            detail.push_str(&format!(": {s}"));
            source = s.source();
        }
        Error::Transport(Transport { may_have_run: !e.is_connect(), timed_out: e.is_timeout(), detail })
    }

    /// Runs `op`: EVALSHA, then EVAL once on NOSCRIPT.
    pub async fn run<O: Operation + Sync>(&self, op: &O) -> Result<O::Outcome, Error> {
        crate::Driver::run(self, op).await
    }
}

impl crate::Driver for Rest {
    async fn send(&self, command: &Command) -> Result<Value, Error> {
        Rest::send(self, command).await
    }
}

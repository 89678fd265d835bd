//! `tribctl edges …`: the fleet list (`list`, in [`super::edges_list`]),
//! edge enrollment tokens and revocation, over the broker's
//! `/v1/edges/{edge_id}/…` endpoints (permission `auth_manage`).
//! `token` prints a new one-time enrollment token once, alone on the last
//! line (the broker keeps only its SHA-256); `revoke` makes every broker
//! refuse the edge's certificates issued up to now.

use std::time::{Duration, SystemTime};

use clap::Subcommand;
use tributary_api::client::Method;
use tributary_api::enroll::{
    DEFAULT_TOKEN_TTL_MS, EdgeRevocation, EnrollmentTokenRequest, EnrollmentTokenResponse,
    MAX_TOKEN_TTL_MS,
};
use tributary_proto::keys::NamespaceName;

use super::{CommandError, Context};

/// `tribctl edges …`.
#[derive(Debug, Subcommand)]
pub enum EdgesCommand {
    /// Every edge the cluster knows: connected since when, last seen,
    /// brokers, per-topic high-water mark and lag.
    List(super::edges_list::ListArgs),
    /// Mint a one-time enrollment token for an edge (`edge-agent enroll
    /// --token`); it replaces the edge's earlier unused token.
    Token {
        /// The edge id (also its namespace).
        edge_id: String,
        /// How long the token may be used: 90s, 30m, 24h, 7d (at most 30
        /// days).
        #[arg(
            long,
            default_value = "24h",
            value_parser = parse_ttl,
            allow_hyphen_values = true
        )]
        ttl: Duration,
    },
    /// Revoke an edge: every broker refuses (and disconnects) its
    /// certificates issued up to now, and its unused token is void. A new
    /// token and `edge-agent enroll` bring the edge id back on a new key.
    Revoke {
        /// The edge id.
        edge_id: String,
    },
}

/// Parses `--ttl`: a duration humantime reads (`90s`, `30m`, `24h`, `7d`),
/// from 1 ms to 30 days.
///
/// # Errors
/// A message naming the accepted forms.
pub fn parse_ttl(text: &str) -> Result<Duration, String> {
    let ttl = humantime::parse_duration(text)
        .map_err(|e| format!("{text:?}: {e} (e.g. 90s, 30m, 24h, 7d)"))?;
    let ms = ttl.as_millis();
    if ms == 0 || ms > u128::from(MAX_TOKEN_TTL_MS) {
        return Err(format!("{text:?}: must be from 1ms to 30 days"));
    }
    Ok(ttl)
}

/// `ms` since the epoch as RFC 3339 UTC, to the second.
fn time(ms: u64) -> String {
    let at = SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
    humantime::format_rfc3339_seconds(at).to_string()
}

/// Runs `tribctl edges …`.
///
/// # Errors
/// [`CommandError`].
pub fn run(ctx: &Context<'_>, command: &EdgesCommand) -> Result<String, CommandError> {
    match command {
        EdgesCommand::List(args) => super::edges_list::list(ctx, args),
        EdgesCommand::Token { edge_id, ttl } => {
            let edge = NamespaceName::new(edge_id)?;
            let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(DEFAULT_TOKEN_TTL_MS);
            let request = EnrollmentTokenRequest {
                ttl_ms: Some(ttl_ms),
            };
            let value = ctx.client()?.send_json(
                Method::Post,
                &format!("/v1/edges/{edge}/token"),
                &serde_json::to_value(&request).unwrap_or_default(),
            )?;
            ctx.render(value, |t: EnrollmentTokenResponse| {
                format!(
                    "enrollment token for edge {} (one use, expires {}; shown once, store it \
                     now):\n{}\n",
                    t.edge_id,
                    time(t.expires_at_ms),
                    t.token
                )
            })
        }
        EdgesCommand::Revoke { edge_id } => {
            let edge = NamespaceName::new(edge_id)?;
            let value = ctx.client()?.send_json(
                Method::Post,
                &format!("/v1/edges/{edge}/revoke"),
                &serde_json::json!({}),
            )?;
            ctx.render(value, |r: EdgeRevocation| {
                format!(
                    "revoked edge {edge}: every broker refuses its certificates issued up to {} \
                     (enroll it again with `tribctl edges token {edge}`)\n",
                    time(r.revoked_at_ms),
                    edge = r.edge_id
                )
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_parse_in_human_units_and_are_bounded() {
        assert_eq!(parse_ttl("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_ttl("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_ttl("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert!(parse_ttl("31d").unwrap_err().contains("30 days"));
        assert!(parse_ttl("0s").is_err());
        assert!(parse_ttl("soon").unwrap_err().contains("24h"));
        assert_eq!(time(0), "1970-01-01T00:00:00Z");
    }
}

//! The permission table: for every `/v1` route (method and axum route
//! template), the [`Permission`] it needs, where the request's scope
//! (namespace, topic) comes from, and whether it is an admin action that
//! goes to the audit log. The guard refuses any route not listed here
//! (fail closed); `tests` walks every route the routers declare.

use super::model::Permission;

/// Where a route's scope comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScopeFrom {
    /// Cluster-wide: needs a binding without namespace.
    Cluster,
    /// The `{namespace}` and `{topic}` path parameters.
    Path,
    /// The `namespace=` query parameter (absent: cluster-wide).
    Query,
    /// A JSON body field holding a namespace name.
    BodyNamespace(&'static str),
    /// A JSON body field holding a topic name `/{ns}/{topic}`.
    BodyTopic(&'static str),
}

/// What a route needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// HTTP method.
    pub method: &'static str,
    /// The axum route template, e.g. `/v1/topics/{namespace}/{topic}`.
    pub path: &'static str,
    /// The permission needed; `None`: any authenticated principal.
    pub permission: Option<Permission>,
    /// Where the scope comes from.
    pub scope: ScopeFrom,
    /// An admin action: recorded in the audit log.
    pub audited: bool,
    /// Whether the route takes query parameters ([`Rule::with_query`]);
    /// the guard refuses a query string on any other (a parameter that
    /// does nothing, such as `?dry_run=true` on a delete, must not pass
    /// for one that did).
    pub query: bool,
}

impl Rule {
    /// This rule for a route whose handler reads query parameters (and
    /// refuses unknown ones itself).
    pub const fn with_query(self) -> Rule {
        Rule {
            query: true,
            ..self
        }
    }
}

const fn rule(
    method: &'static str,
    path: &'static str,
    permission: Permission,
    scope: ScopeFrom,
    audited: bool,
) -> Rule {
    Rule {
        method,
        path,
        permission: Some(permission),
        scope,
        audited,
        query: false,
    }
}

use Permission::*;
use ScopeFrom::*;

const TOPIC: &str = "/v1/topics/{namespace}/{topic}";
const SUB: &str = "/v1/topics/{namespace}/{topic}/subscriptions/{subscription}";

/// Every `/v1` route of the admin, storage, consumer and auth APIs.
pub const RULES: &[Rule] = &[
    // Admin API.
    rule("GET", "/v1/namespaces", TopicsRead, Cluster, false),
    rule(
        "POST",
        "/v1/namespaces",
        TopicsWrite,
        BodyNamespace("name"),
        true,
    ),
    rule("GET", "/v1/topics", TopicsRead, Query, false).with_query(),
    rule("POST", "/v1/topics", TopicsWrite, BodyTopic("name"), true),
    rule("GET", TOPIC, TopicsRead, Path, false),
    rule("DELETE", TOPIC, TopicsWrite, Path, true),
    rule(
        "POST",
        "/v1/topics/{namespace}/{topic}/skip-damaged",
        TopicsWrite,
        Path,
        true,
    ),
    rule(
        "GET",
        concat!(
            "/v1/topics/{namespace}/{topic}/subscriptions/{subscription}",
            "/failure-policy"
        ),
        TopicsRead,
        Path,
        false,
    ),
    rule(
        "PUT",
        concat!(
            "/v1/topics/{namespace}/{topic}/subscriptions/{subscription}",
            "/failure-policy"
        ),
        TopicsWrite,
        Path,
        true,
    ),
    rule(
        "PATCH",
        concat!(
            "/v1/topics/{namespace}/{topic}/subscriptions/{subscription}",
            "/failure-policy"
        ),
        TopicsWrite,
        Path,
        true,
    ),
    rule("POST", "/v1/apply", TopicsWrite, Cluster, true).with_query(),
    rule("GET", "/v1/cluster/status", ClusterRead, Cluster, false),
    rule("GET", "/v1/edges", ClusterRead, Cluster, false),
    rule("POST", "/v1/cluster/rebalance", TopicsWrite, Cluster, true),
    rule(
        "POST",
        "/v1/topics/{namespace}/{topic}/move",
        TopicsWrite,
        Path,
        true,
    ),
    // Storage API (the tier service).
    rule("GET", "/v1/storage/cluster", Storage, Cluster, false),
    rule("GET", "/v1/storage/topics", Storage, Cluster, false).with_query(),
    rule(
        "GET",
        "/v1/storage/topics/{namespace}/{topic}/segments",
        Storage,
        Path,
        false,
    )
    .with_query(),
    rule(
        "POST",
        "/v1/storage/descriptors",
        Storage,
        BodyTopic("topic"),
        true,
    )
    .with_query(),
    rule(
        "POST",
        "/v1/storage/topics/{namespace}/{topic}/trim",
        Storage,
        Path,
        true,
    )
    .with_query(),
    rule(
        "POST",
        "/v1/storage/topics/{namespace}/{topic}/unload",
        Storage,
        Path,
        true,
    )
    .with_query(),
    rule(
        "DELETE",
        "/v1/storage/topics/{namespace}/{topic}/segments/{start}",
        Storage,
        Path,
        true,
    )
    .with_query(),
    rule(
        "PUT",
        "/v1/storage/topics/{namespace}/{topic}/missing/{start}",
        Storage,
        Path,
        true,
    )
    .with_query(),
    rule(
        "DELETE",
        "/v1/storage/topics/{namespace}/{topic}/missing/{start}",
        Storage,
        Path,
        true,
    )
    .with_query(),
    rule(
        "PUT",
        "/v1/storage/topics/{namespace}/{topic}/lakehouse",
        Storage,
        Path,
        true,
    )
    .with_query(),
    // Consumer API: data plane (not audited) and subscription management.
    rule(
        "GET",
        "/v1/topics/{namespace}/{topic}/records",
        Consume,
        Path,
        false,
    )
    .with_query(),
    rule(
        "POST",
        "/v1/topics/{namespace}/{topic}/records",
        Produce,
        Path,
        false,
    )
    .with_query(),
    rule("GET", SUB, Consume, Path, false),
    rule("DELETE", SUB, SubscriptionsManage, Path, true),
    rule(
        "POST",
        concat!(
            "/v1/topics/{namespace}/{topic}/subscriptions/{subscription}",
            "/attach"
        ),
        Consume,
        Path,
        false,
    ),
    rule(
        "POST",
        concat!(
            "/v1/topics/{namespace}/{topic}/subscriptions/{subscription}",
            "/detach"
        ),
        Consume,
        Path,
        false,
    ),
    rule(
        "POST",
        concat!(
            "/v1/topics/{namespace}/{topic}/subscriptions/{subscription}",
            "/receive"
        ),
        Consume,
        Path,
        false,
    ),
    rule(
        "POST",
        concat!(
            "/v1/topics/{namespace}/{topic}/subscriptions/{subscription}",
            "/read"
        ),
        Consume,
        Path,
        false,
    ),
    rule(
        "POST",
        concat!(
            "/v1/topics/{namespace}/{topic}/subscriptions/{subscription}",
            "/ack"
        ),
        Consume,
        Path,
        false,
    ),
    rule(
        "POST",
        concat!(
            "/v1/topics/{namespace}/{topic}/subscriptions/{subscription}",
            "/ack-up-to"
        ),
        Consume,
        Path,
        false,
    ),
    rule(
        "POST",
        concat!(
            "/v1/topics/{namespace}/{topic}/subscriptions/{subscription}",
            "/nack"
        ),
        Consume,
        Path,
        false,
    ),
    rule(
        "POST",
        concat!(
            "/v1/topics/{namespace}/{topic}/subscriptions/{subscription}",
            "/seek"
        ),
        SubscriptionsManage,
        Path,
        true,
    ),
    rule(
        "POST",
        concat!(
            "/v1/topics/{namespace}/{topic}/subscriptions/{subscription}",
            "/pause"
        ),
        SubscriptionsManage,
        Path,
        true,
    ),
    rule(
        "POST",
        concat!(
            "/v1/topics/{namespace}/{topic}/subscriptions/{subscription}",
            "/resume"
        ),
        SubscriptionsManage,
        Path,
        true,
    ),
    rule(
        "POST",
        concat!(
            "/v1/topics/{namespace}/{topic}/subscriptions/{subscription}",
            "/replay-dlq"
        ),
        SubscriptionsManage,
        Path,
        true,
    ),
    // Auth API.
    rule("GET", "/v1/auth/principals", AuthManage, Cluster, false),
    rule("POST", "/v1/auth/principals", AuthManage, Cluster, true),
    rule(
        "DELETE",
        "/v1/auth/principals/{name}",
        AuthManage,
        Cluster,
        true,
    ),
    rule("GET", "/v1/auth/bindings", AuthManage, Cluster, false).with_query(),
    rule("POST", "/v1/auth/bindings", AuthManage, Cluster, true),
    rule(
        "DELETE",
        "/v1/auth/bindings/{id}",
        AuthManage,
        Cluster,
        true,
    ),
    rule("GET", "/v1/auth/roles", AuthManage, Cluster, false),
    rule("PUT", "/v1/auth/roles/{role}", AuthManage, Cluster, true),
    rule("DELETE", "/v1/auth/roles/{role}", AuthManage, Cluster, true),
    // Edge enrollment tokens and revocation (`crate::enroll`).
    rule("POST", "/v1/edges/{edge}/token", AuthManage, Cluster, true),
    rule("POST", "/v1/edges/{edge}/revoke", AuthManage, Cluster, true),
    Rule {
        method: "GET",
        path: "/v1/auth/whoami",
        permission: None,
        scope: Cluster,
        audited: false,
        query: false,
    },
];

/// The methods listed for route template `path` (empty for an unknown
/// route), in table order.
pub fn methods(path: &str) -> Vec<&'static str> {
    RULES
        .iter()
        .filter(|rule| rule.path == path)
        .map(|rule| rule.method)
        .collect()
}

/// The rule of `method` on route template `path`, if listed.
pub fn lookup(method: &str, path: &str) -> Option<&'static Rule> {
    RULES
        .iter()
        .find(|rule| rule.method == method && rule.path == path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_lists_each_route_once_and_sub_routes_match_the_constant() {
        for (i, a) in RULES.iter().enumerate() {
            for b in &RULES[i + 1..] {
                assert!(
                    !(a.method == b.method && a.path == b.path),
                    "{} {} listed twice",
                    a.method,
                    a.path
                );
            }
            assert!(a.path.starts_with("/v1/"), "{}", a.path);
            // Every write is an admin action or a data-plane call.
            if a.method == "GET" {
                assert!(!a.audited, "{} {}", a.method, a.path);
            }
        }
        assert!(lookup("GET", SUB).is_some());
        assert!(lookup("GET", "/v1/nothing").is_none());
    }
}

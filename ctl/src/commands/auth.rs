//! `tribctl auth …`: principals (named tokens and certificate identities),
//! role bindings, roles and `whoami`, over the broker's `/v1/auth`
//! endpoints. `create` prints a new token once, on stdout only: the broker
//! keeps only its SHA-256.

use clap::{Subcommand, ValueEnum};
use serde_json::json;
use tributary_api::auth::{
    Binding, BindingInfo, BindingList, CreatePrincipalRequest, CreatePrincipalResponse,
    PrincipalKind, PrincipalList, RoleList, WhoAmI,
};
use tributary_api::client::Method;
use tributary_proto::keys::PrincipalName;

use super::{CommandError, Context};

/// `--kind` of `tribctl auth create`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KindArg {
    /// A named bearer token (printed once).
    Token,
    /// A client certificate whose identity is the principal's name.
    Certificate,
}

/// A role and its scope on the command line.
#[derive(Debug, Clone, clap::Args)]
pub struct ScopeArgs {
    /// Namespace the role applies to (default: every namespace).
    #[arg(long)]
    pub namespace: Option<String>,
    /// Only topics of `--namespace` whose name starts with this.
    #[arg(long, requires = "namespace")]
    pub topic_prefix: Option<String>,
}

/// `tribctl auth …`.
#[derive(Debug, Subcommand)]
pub enum AuthCommand {
    /// Create a principal; for a token, print it once.
    Create {
        /// Principal name.
        name: String,
        /// How it authenticates.
        #[arg(long, value_enum, default_value_t = KindArg::Token)]
        kind: KindArg,
        /// Grant this role at once.
        #[arg(long)]
        role: Option<String>,
        /// Scope of `--role`.
        #[command(flatten)]
        scope: ScopeArgs,
    },
    /// List principals.
    List,
    /// Revoke a principal: delete it and all its bindings (every broker
    /// refuses its token within seconds).
    Revoke {
        /// Principal name.
        name: String,
    },
    /// Grant a role to a principal (idempotent).
    Grant {
        /// Principal name.
        name: String,
        /// Role (built-in: admin, tier, consumer, producer; or custom).
        #[arg(long)]
        role: String,
        /// Scope.
        #[command(flatten)]
        scope: ScopeArgs,
    },
    /// Remove a grant (the same arguments as `grant`).
    Ungrant {
        /// Principal name.
        name: String,
        /// Role.
        #[arg(long)]
        role: String,
        /// Scope.
        #[command(flatten)]
        scope: ScopeArgs,
    },
    /// List roles and their permissions.
    Roles,
    /// List role bindings, optionally of one principal.
    Bindings {
        /// Only this principal's.
        #[arg(long)]
        principal: Option<String>,
    },
    /// Who the presented token is, and its bindings.
    Whoami,
}

fn binding(name: &str, role: &str, scope: &ScopeArgs) -> Binding {
    Binding {
        principal: name.to_owned(),
        role: role.to_owned(),
        namespace: scope.namespace.clone(),
        topic_prefix: scope.topic_prefix.clone(),
    }
}

fn scope_text(b: &Binding) -> String {
    match (&b.namespace, &b.topic_prefix) {
        (None, _) => "cluster-wide".to_owned(),
        (Some(ns), None) => format!("namespace {ns}"),
        (Some(ns), Some(prefix)) => format!("namespace {ns}, topics {prefix}*"),
    }
}

fn binding_line(b: &BindingInfo) -> String {
    format!(
        "{}  {} {} ({})\n",
        b.id,
        b.binding.principal,
        b.binding.role,
        scope_text(&b.binding)
    )
}

/// Runs `tribctl auth …`.
///
/// # Errors
/// [`CommandError`].
pub fn run(ctx: &Context<'_>, command: &AuthCommand) -> Result<String, CommandError> {
    let client = ctx.client()?;
    match command {
        AuthCommand::Create {
            name,
            kind,
            role,
            scope,
        } => {
            PrincipalName::new(name)?;
            let kind = match kind {
                KindArg::Token => PrincipalKind::Token,
                KindArg::Certificate => PrincipalKind::Certificate,
            };
            // The principal and its role in one request: both or neither.
            let request = CreatePrincipalRequest {
                name: name.clone(),
                kind,
                role: role.clone(),
                namespace: role.as_ref().and(scope.namespace.clone()),
                topic_prefix: role.as_ref().and(scope.topic_prefix.clone()),
            };
            let value = client.send_json(Method::Post, "/v1/auth/principals", &json!(request))?;
            let kind = kind.as_str();
            ctx.render(value, |c: CreatePrincipalResponse| {
                let mut text = format!("created {} principal {}\n", kind, c.principal.name);
                if let Some(b) = &c.binding {
                    text.push_str(&format!("granted {}", binding_line(b)));
                }
                if let Some(token) = c.token {
                    text.push_str(&format!("token (shown once, store it now):\n{token}\n"));
                }
                text
            })
        }
        AuthCommand::List => {
            let value = client.get("/v1/auth/principals", &[])?;
            ctx.render(value, |list: PrincipalList| {
                list.principals
                    .iter()
                    .map(|p| {
                        format!(
                            "{}  {}  created by {} at {} ms\n",
                            p.name,
                            p.kind.as_str(),
                            p.created_by,
                            p.created_at_ms
                        )
                    })
                    .collect()
            })
        }
        AuthCommand::Revoke { name } => {
            let name = PrincipalName::new(name)?;
            let value = client.delete(&format!("/v1/auth/principals/{name}"))?;
            #[derive(serde::Deserialize)]
            struct Revoked {
                revoked: String,
                bindings_removed: Vec<String>,
            }
            ctx.render(value, |r: Revoked| {
                format!(
                    "revoked {} ({} binding(s) removed)\n",
                    r.revoked,
                    r.bindings_removed.len()
                )
            })
        }
        AuthCommand::Grant { name, role, scope } => {
            PrincipalName::new(name)?;
            let value = client.send_json(
                Method::Post,
                "/v1/auth/bindings",
                &json!(binding(name, role, scope)),
            )?;
            ctx.render(value, |b: BindingInfo| {
                format!("granted {}", binding_line(&b))
            })
        }
        AuthCommand::Ungrant { name, role, scope } => {
            let wanted = binding(name, role, scope);
            let list: BindingList =
                super::decode(client.get("/v1/auth/bindings", &[("principal", name.as_str())])?)?;
            let Some(found) = list.bindings.into_iter().find(|b| b.binding == wanted) else {
                return Err(CommandError::Decode(format!(
                    "{name} holds no {role} binding with that scope"
                )));
            };
            let value = client.delete(&format!("/v1/auth/bindings/{}", found.id))?;
            ctx.render(value, |_: serde_json::Value| {
                format!("removed {}", binding_line(&found))
            })
        }
        AuthCommand::Roles => {
            let value = client.get("/v1/auth/roles", &[])?;
            ctx.render(value, |list: RoleList| {
                list.roles
                    .iter()
                    .map(|r| {
                        format!(
                            "{}{}: {}\n",
                            r.name,
                            if r.built_in { " (built-in)" } else { "" },
                            r.permissions.join(", ")
                        )
                    })
                    .collect()
            })
        }
        AuthCommand::Bindings { principal } => {
            let query: Vec<(&str, &str)> = principal
                .as_deref()
                .map(|p| vec![("principal", p)])
                .unwrap_or_default();
            let value = client.get("/v1/auth/bindings", &query)?;
            ctx.render(value, |list: BindingList| {
                list.bindings.iter().map(binding_line).collect()
            })
        }
        AuthCommand::Whoami => {
            let value = client.get("/v1/auth/whoami", &[])?;
            ctx.render(value, |who: WhoAmI| {
                let mut text = format!("{} ({})\n", who.name, who.kind);
                for b in &who.bindings {
                    text.push_str(&format!("  {}", binding_line(b)));
                }
                text
            })
        }
    }
}

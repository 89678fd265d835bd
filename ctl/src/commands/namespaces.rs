//! `tribctl namespaces …`: create (idempotent) and list namespaces.

use clap::Subcommand;
use serde::Deserialize;
use serde_json::json;
use tributary_api::admin::PlanAction;
use tributary_api::client::Method;
use tributary_proto::keys::NamespaceName;

use super::{CommandError, Context};

/// `tribctl namespaces …`.
#[derive(Debug, Subcommand)]
pub enum NamespacesCommand {
    /// Create a namespace (idempotent).
    Create {
        /// Namespace name.
        namespace: String,
    },
    /// List namespaces.
    List,
}

/// Runs `tribctl namespaces …`.
///
/// # Errors
/// [`CommandError`].
pub fn run(ctx: &Context<'_>, command: &NamespacesCommand) -> Result<String, CommandError> {
    let client = ctx.client()?;
    match command {
        NamespacesCommand::Create { namespace } => {
            let namespace = NamespaceName::new(namespace)?;
            let value =
                client.send_json(Method::Post, "/v1/namespaces", &json!({"name": namespace}))?;
            #[derive(Deserialize)]
            struct Created {
                namespace: NamespaceName,
                action: PlanAction,
            }
            ctx.render(value, |c: Created| {
                let verb = match c.action {
                    PlanAction::Create => "created",
                    PlanAction::Update => "updated",
                    PlanAction::Unchanged => "unchanged",
                };
                format!("{verb} namespace {}\n", c.namespace)
            })
        }
        NamespacesCommand::List => {
            let value = client.get("/v1/namespaces", &[])?;
            #[derive(Deserialize)]
            struct Namespaces {
                namespaces: Vec<NamespaceName>,
            }
            ctx.render(value, |list: Namespaces| {
                list.namespaces.iter().map(|n| format!("{n}\n")).collect()
            })
        }
    }
}

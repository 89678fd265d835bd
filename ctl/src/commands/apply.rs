//! `tribctl apply`: sends a declarative manifest (YAML) to the admin API,
//! which validates all of it and applies all of it or nothing, and prints
//! the plan.

use std::path::PathBuf;

use clap::Args;
use tributary_api::admin::{ApplyReport, ItemKind, PlanAction, PlanItem};
use tributary_api::client::Method;

use super::{CommandError, Context, partitions_text};

/// Options of `tribctl apply`.
#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// The manifest (YAML): `namespaces: [..]`, `topics: [{name, intent,
    /// partitions}]`.
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Print the plan without changing anything.
    #[arg(long)]
    pub dry_run: bool,
}

/// Runs `tribctl apply`: sends the manifest text to the API, which
/// validates everything and applies all of it or nothing.
///
/// # Errors
/// [`CommandError`]; manifest issues come back as [`ClientError::Api`]
/// with the issues in the `errors` field of its body
/// ([`client::manifest_issues`]).
pub fn run(ctx: &Context<'_>, args: &ApplyArgs) -> Result<String, CommandError> {
    let client = ctx.client()?;
    let text = std::fs::read_to_string(&args.file).map_err(|source| CommandError::ReadFile {
        path: args.file.clone(),
        source,
    })?;
    let file = args.file.display().to_string();
    let dry_run = if args.dry_run { "true" } else { "false" };
    let value = client.send(
        Method::Post,
        "/v1/apply",
        &[("file", &file), ("dry_run", dry_run)],
        "application/yaml",
        text.as_bytes(),
    )?;
    ctx.render(value, |report: ApplyReport| plan_text(&report))
}

fn plan_item_text(item: &PlanItem) -> String {
    let mut line = format!(
        "{:<9} {} {}",
        item.action.as_str(),
        item.kind.as_str(),
        item.name
    );
    if item.kind == ItemKind::Topic
        && let (Some(intent), Some(partitions)) = (item.intent, item.partitions)
    {
        line.push_str(&format!(" ({intent}, {})", partitions_text(partitions)));
    }
    if !item.changes.is_empty() {
        let changes: Vec<String> = item
            .changes
            .iter()
            .map(|c| format!("{} {} -> {}", c.field, c.existing, c.requested))
            .collect();
        line.push_str(&format!(": {}", changes.join(", ")));
    }
    line.push('\n');
    line
}

fn plan_text(report: &ApplyReport) -> String {
    let mut text: String = report.plan.items.iter().map(plan_item_text).collect();
    let (create, update, unchanged) = (
        report.plan.count(PlanAction::Create),
        report.plan.count(PlanAction::Update),
        report.plan.count(PlanAction::Unchanged),
    );
    if report.dry_run {
        text.push_str(&format!(
            "dry run: {create} to create, {update} to update, {unchanged} unchanged; \
             nothing applied\n"
        ));
    } else {
        text.push_str(&format!(
            "applied: {create} created, {update} updated, {unchanged} unchanged\n"
        ));
    }
    text
}

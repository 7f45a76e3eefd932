//! One file per scenario. Each runs against the system under test of one
//! round, adds its figures to the table and its failures to the outcome;
//! a scenario that does not apply to the system (or to a cluster the
//! benchmark did not start) does nothing.

mod budgets;
mod million;
mod repair;
mod rolling;
mod s1;
mod s2;
mod s3;
mod s4;
mod s5;
mod s6;
mod soak;
mod validate;

use std::{path::Path, sync::Arc, time::Duration};

use anyhow::{bail, Result};
use fenced_bench::check::TokenLedger;

use crate::{
    report::{Outcome, Table},
    sut::Sut,
    systems::Kind,
    Args,
};

/// What every scenario of one system's round works with.
pub struct Ctx<'a> {
    pub args: &'a Args,
    pub kind: Kind,
    /// The round's work directory.
    pub dir: &'a Path,
    /// How long each measured run lasts.
    pub duration: Duration,
    /// Every grant of the round, checked for token order.
    pub ledger: Arc<TokenLedger>,
    pub sut: Sut,
    pub table: &'a mut Table,
    pub out: &'a mut Outcome,
}

/// Every scenario, in the order a run takes them.
pub const ALL: [&str; 12] = [
    "s1", "validate", "s2", "s3", "s4", "s5", "s6", "rolling", "budgets", "million", "repair",
    "soak",
];

/// Runs scenario `name`.
pub async fn run(name: &str, cx: &mut Ctx<'_>) -> Result<()> {
    match name {
        "s1" => s1::run(cx).await,
        "validate" => validate::run(cx).await,
        "s2" => s2::run(cx).await,
        "s3" => s3::run(cx).await,
        "s4" => s4::run(cx).await,
        "s5" => s5::run(cx).await,
        "s6" => s6::run(cx).await,
        "rolling" => rolling::run(cx).await,
        "budgets" => budgets::run(cx).await,
        "million" => million::run(cx).await,
        "repair" => repair::run(cx).await,
        "soak" => soak::run(cx).await,
        other => bail!("unknown scenario {other:?}: {}", ALL.join(", ")),
    }
}

//! BackupPlan decisions as plain data: which schedule slot is due, the run's deterministic
//! name, and which of the plan's Backups retention removes.

use std::time::Duration;

use croner::Cron;
use croner::parser::{CronParser, Seconds};
use k8s_openapi::jiff::{Timestamp, tz::TimeZone};

pub use custody_proto::names::{LABEL_PLAN, LABEL_PLAN_UID};

/// A parsed schedule: five fields (minute precision) or six (with seconds).
#[derive(Clone, Debug)]
pub struct Schedule {
    cron: Cron,
    with_seconds: bool,
}

/// Parses a cron schedule.
pub fn parse(schedule: &str) -> Result<Schedule, String> {
    let cron = CronParser::builder()
        .seconds(Seconds::Optional)
        .build()
        .parse(schedule)
        .map_err(|error| format!("schedule {schedule:?}: {error}"))?;
    Ok(Schedule {
        cron,
        with_seconds: schedule.split_whitespace().count() == 6,
    })
}

/// What the plan should do now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Due {
    /// Nothing until `next`.
    Wait { next: Timestamp },
    /// Start the run of `slot`.
    Run { slot: Timestamp, next: Timestamp },
    /// The run of `slot` is past its starting deadline: skip it.
    Missed { slot: Timestamp, next: Timestamp },
}

/// The latest slot in `(since, now]` (at most one run per check: older missed slots are not
/// caught up), judged against the starting deadline.
pub fn due(
    schedule: &Schedule,
    since: Timestamp,
    now: Timestamp,
    deadline: Option<Duration>,
) -> Result<Due, String> {
    let utc = |time: Timestamp| time.to_zoned(TimeZone::UTC);
    let next = schedule
        .cron
        .find_next_occurrence(&utc(now), false)
        .map_err(|error| error.to_string())?
        .timestamp();
    let previous = schedule
        .cron
        .find_previous_occurrence(&utc(now), true)
        .map_err(|error| error.to_string())
        .map(|zoned| zoned.timestamp());
    let Ok(slot) = previous else {
        return Ok(Due::Wait { next });
    };
    if slot <= since {
        return Ok(Due::Wait { next });
    }
    let late = Duration::try_from(now.duration_since(slot)).unwrap_or(Duration::ZERO);
    if deadline.is_some_and(|deadline| late > deadline) {
        return Ok(Due::Missed { slot, next });
    }
    Ok(Due::Run { slot, next })
}

/// The run's name: `<plan>-<unix minutes>` (or `<plan>-<unix seconds>` for six-field
/// schedules). The same slot always gets the same name, so a run is never created twice,
/// whatever restarts in between.
pub fn run_name(plan: &str, slot: Timestamp, schedule: &Schedule) -> String {
    let number = if schedule.with_seconds {
        slot.as_second()
    } else {
        slot.as_second().div_euclid(60)
    };
    let suffix = format!("-{number}");
    let base: String = plan.chars().take(253 - suffix.len()).collect();
    format!("{base}{suffix}")
}

/// Parses `1d12h30m`-style ages.
pub fn parse_age(text: &str) -> Result<Duration, String> {
    let mut total = 0u64;
    let mut number = String::new();
    for character in text.chars() {
        if character.is_ascii_digit() {
            number.push(character);
            continue;
        }
        let value: u64 = number
            .parse()
            .map_err(|_| format!("{text:?} is not an age such as 7d or 36h"))?;
        number.clear();
        let unit = match character {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            _ => return Err(format!("{text:?}: unknown unit {character:?}")),
        };
        total = total.saturating_add(value.saturating_mul(unit));
    }
    if !number.is_empty() || text.is_empty() {
        return Err(format!("{text:?} is not an age such as 7d or 36h"));
    }
    Ok(Duration::from_secs(total))
}

/// One of the plan's Backups, as retention sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Run {
    pub name: String,
    pub uid: String,
    pub created: Timestamp,
    /// Completed or Failed.
    pub finished: bool,
    pub completed: bool,
}

/// The runs retention deletes: finished runs beyond the newest `keep_last`, and finished runs
/// older than `max_age`. Never a run that has not finished, and never the newest completed
/// run (a plan that stopped working must not age its last good backup away).
pub fn prune(
    runs: &[Run],
    keep_last: Option<usize>,
    max_age: Option<Duration>,
    now: Timestamp,
) -> Vec<Run> {
    let mut finished: Vec<&Run> = runs.iter().filter(|run| run.finished).collect();
    finished.sort_by(|a, b| b.created.cmp(&a.created).then_with(|| b.name.cmp(&a.name)));
    let newest_completed = finished
        .iter()
        .find(|run| run.completed)
        .map(|run| run.uid.clone());
    finished
        .iter()
        .enumerate()
        .filter(|(index, run)| {
            let beyond_count = keep_last.is_some_and(|keep| *index >= keep);
            let too_old = max_age.is_some_and(|age| {
                Duration::try_from(now.duration_since(run.created)).unwrap_or(Duration::ZERO) > age
            });
            (beyond_count || too_old) && Some(&run.uid) != newest_completed.as_ref()
        })
        .map(|(_, run)| (*run).clone())
        .collect()
}

/// Why a plan's runs would need a person, if they would: no command, and no consistency
/// method on the plan or on its Cluster (`cluster`, when it exists), so each run could copy
/// the volume only while the application is stopped, which nobody does at 02:00.
pub fn needs_a_person(
    spec: &custody_kube::api::BackupPlanSpec,
    cluster: Option<&custody_kube::api::Cluster>,
) -> Option<String> {
    let cluster = cluster?;
    if spec.command.is_some() || spec.consistency.is_some() || cluster.spec.consistency.is_some() {
        return None;
    }
    Some(format!(
        "neither this plan nor Cluster {} names spec.consistency, so each run could copy its volumes only while the application is stopped, and a plan runs unattended: name a method (Freeze, Tool, Hooks or CrashUnsafe) on the plan or the Cluster, or a command",
        spec.cluster_ref.name
    ))
}

#[cfg(test)]
mod tests;

use clap::Parser;
use custody_controller::cli::{Cli, Command};
use custody_kube::process::init_tracing;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(options) => {
            init_tracing(options.log_format);
            custody_controller::run::run(*options).await?;
        }
        Command::Uninstall(options) => {
            init_tracing(custody_kube::process::LogFormat::Text);
            let summary = custody_controller::uninstall::run(&options).await?;
            println!(
                "custody released: {} webhook configurations deleted, {} finalizers removed from custody objects, {} from Secrets, {} namespaces unmarked",
                summary.webhook_configurations,
                summary.objects_released,
                summary.secrets_released,
                summary.namespaces_unmarked
            );
            if !summary.held_pods.is_empty() {
                println!(
                    "still held by custody-wait (they will not start without custody's agent: delete them, or install custody again): {}",
                    summary.held_pods.join(", ")
                );
            }
        }
        Command::Crds { dir: Some(dir) } => custody_controller::run::write_crds(&dir)?,
        Command::Crds { dir: None } => print!("{}", custody_controller::run::crds_yaml()?),
    }
    Ok(())
}

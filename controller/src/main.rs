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
        Command::Crds { dir: Some(dir) } => custody_controller::run::write_crds(&dir)?,
        Command::Crds { dir: None } => print!("{}", custody_controller::run::crds_yaml()?),
    }
    Ok(())
}

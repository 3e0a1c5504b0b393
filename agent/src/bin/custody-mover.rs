use clap::Parser;
use custody_agent::cli::MoverOptions;
use custody_agent::mover;
use custody_proto::reasons::MoverFailure;

// Linked for its `memcpy`, `memcmp` and kin, which replace musl's (see the crate).
use custody_mem as _;

/// See [`custody_agent::allocator`].
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    custody_agent::allocator::give_back_at_once();
    no_backtraces_in_errors();
    let options = MoverOptions::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("custody-mover: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    // On SIGTERM a backup aborts its multipart upload (an open upload keeps its parts, and
    // their storage, until aborted) and ends within the grace; anything else ends at once.
    let grace = match options.command {
        custody_agent::cli::MoverCommand::Backup { .. } => std::time::Duration::from_secs(20),
        _ => std::time::Duration::ZERO,
    };
    match &options.command {
        custody_agent::cli::MoverCommand::StreamSetup { dir } => {
            return match mover::stream::setup(dir) {
                Ok(()) => std::process::ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!(
                        "custody-mover: preparing the tool's stream in {}: {error}",
                        dir.display()
                    );
                    std::process::ExitCode::FAILURE
                }
            };
        }
        custody_agent::cli::MoverCommand::ScratchCheck {
            claim,
            source,
            scratch,
            limit_bytes,
        } => {
            if claim.len() != source.len() {
                eprintln!("custody-mover: --claim and --source are given in pairs");
                return std::process::ExitCode::FAILURE;
            }
            let claims: Vec<(String, std::path::PathBuf)> =
                claim.iter().cloned().zip(source.iter().cloned()).collect();
            return match mover::usage::check_scratch(&claims, scratch, *limit_bytes) {
                Ok(()) => std::process::ExitCode::SUCCESS,
                Err(mover::usage::ScratchError::Refused(refusal)) => {
                    eprintln!("{refusal}");
                    std::process::ExitCode::from(custody_proto::mover::SCRATCH_REFUSED_EXIT as u8)
                }
                Err(mover::usage::ScratchError::Failed(error)) => {
                    eprintln!("custody-mover: {error}");
                    std::process::ExitCode::FAILURE
                }
            };
        }
        custody_agent::cli::MoverCommand::StreamTool { dir, command } => {
            return match runtime.block_on(mover::stream::run_tool(dir, command)) {
                Ok(code) => std::process::ExitCode::from(u8::try_from(code).unwrap_or(1)),
                Err(error) => {
                    eprintln!("custody-mover: running the tool: {error}");
                    std::process::ExitCode::FAILURE
                }
            };
        }
        _ => {}
    }
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let outcome = runtime.block_on(async {
        tokio::select! {
            outcome = custody_agent::mover::cli::run(&options, stopped) => outcome,
            _ = async {
                custody_kube::process::wait_for_signal().await;
                let _ = stop.send(true);
                tokio::time::sleep(grace).await;
            } => Err((MoverFailure::Interrupted, "stopped by a signal".to_string())),
        }
    });
    match outcome {
        Ok(json) => {
            println!("{json}");
            mover::write_result(options.result_file.as_ref(), &json);
            std::process::ExitCode::SUCCESS
        }
        Err((reason, message)) => {
            eprintln!("custody-mover: {reason}: {message}");
            let json = custody_proto::mover::failure_text(reason, message);
            mover::write_result(options.result_file.as_ref(), &json);
            if reason.permanent() {
                std::process::ExitCode::from(custody_proto::mover::EXIT_PERMANENT)
            } else {
                std::process::ExitCode::FAILURE
            }
        }
    }
}

/// rustic_core builds an error, with `Backtrace::capture()`, for every block its index does
/// not hold, and a backup asks for every block it reads. With `RUST_BACKTRACE` set in the
/// environment each capture unwinds the stack: a backup of the benchmark set took 2.4× as
/// long. Errors' backtraces stay off unless `RUST_LIB_BACKTRACE` asks for them (a panic's
/// still follows `RUST_BACKTRACE`).
#[allow(unsafe_code)]
fn no_backtraces_in_errors() {
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        // SAFETY: the first statement of `main`: no other thread exists to read the
        // environment.
        unsafe { std::env::set_var("RUST_LIB_BACKTRACE", "0") };
    }
}

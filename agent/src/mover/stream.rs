//! A tool that writes its backup as a tar stream (`pg_basebackup -F tar -D -`), read by the
//! mover as it is produced: no scratch copy of the database on the node.
//!
//! The Job's pod shares one small directory between three containers:
//!
//! - `custody-mover stream-setup` (an init container of the mover's image) creates the FIFO
//!   [`stream::FIFO`] there and copies this program into it ([`stream::PROGRAM`], a static
//!   binary that runs in any image);
//! - the tool's container runs `custody-mover stream-tool -- <the tool's command>`: the
//!   command's standard output is the FIFO, its standard error the container's log; once it
//!   exited, its exit code is written to [`stream::STATUS`] (atomically, by a rename);
//! - the mover reads the FIFO ([`TarInput::open`]) and, once the stream ended, seals the
//!   snapshot only if the tool exited 0 ([`TarInput::outcome`]). A tool that failed halfway
//!   may have written what reads as a whole tar: only its exit code says it is a backup.

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use custody_proto::mover::stream;

use crate::manifest_builder::BuildError;

/// The stream's pipe buffer (Linux's default `pipe-max-size`).
const PIPE_SIZE: usize = 1 << 20;
/// How often a wait for the tool says what it waits for.
const SAY_EVERY: Duration = Duration::from_secs(30);
/// How long the mover waits for the tool's exit code once its stream ended: a tool exits as it
/// closes its output, so this bounds a wrapper that died without writing it.
const EXIT_AFTER_EOF: Duration = Duration::from_secs(120);

/// A wait that says every [`SAY_EVERY`] how long it has lasted and what it waits for.
struct Waiting {
    started: Instant,
    said: Instant,
}

impl Waiting {
    fn start() -> Waiting {
        let now = Instant::now();
        Waiting {
            started: now,
            said: now,
        }
    }

    fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Says `what` (given the seconds waited so far) when [`SAY_EVERY`] passed since it last
    /// said it.
    fn say_when_due(&mut self, what: impl FnOnce(u64) -> String) {
        if self.said.elapsed() >= SAY_EVERY {
            eprintln!("custody-mover: {}", what(self.elapsed().as_secs()));
            self.said = Instant::now();
        }
    }
}

/// The init container's step: the FIFO and the program, readable and writable by whatever
/// user the tool's image runs as.
pub fn setup(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let fifo = dir.join(stream::FIFO);
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
    )
    .map_err(|errno| io::Error::other(format!("creating {}: {errno}", fifo.display())))?;
    std::fs::set_permissions(&fifo, std::fs::Permissions::from_mode(0o666))?;
    let program = dir.join(stream::PROGRAM);
    std::fs::copy(std::env::current_exe()?, &program)?;
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755))?;
    // The tool writes its exit code here, as its own user.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777))?;
    Ok(())
}

/// The tool container's step: runs `command` with its standard output on the FIFO, forwards
/// SIGTERM to it, records its exit code (also when it could not start, or was stopped before:
/// the mover waits for it); that exit code (128 + the signal's number when a signal ended it).
pub async fn run_tool(dir: &Path, command: &[String]) -> io::Result<i32> {
    // Listening from the start: as PID 1 of its container, a signal without a handler would be
    // ignored (the pod would wait out its grace period).
    let signal = custody_kube::process::wait_for_signal();
    tokio::pin!(signal);
    let code = match command.split_first() {
        None => {
            eprintln!("custody-mover: stream-tool: no command after --");
            1
        }
        Some((program, args)) => {
            let opened = tokio::select! {
                opened = open_for_the_mover(dir) => Some(opened),
                _ = &mut signal => None,
            };
            match opened {
                None => SIGTERM_EXIT,
                Some(Err(error)) => {
                    eprintln!("custody-mover: opening the stream: {error}");
                    1
                }
                Some(Ok(output)) => {
                    let spawned = tokio::process::Command::new(program)
                        .args(args)
                        .stdout(std::process::Stdio::from(output))
                        .spawn();
                    match spawned {
                        Err(error) => {
                            eprintln!("custody-mover: starting {program}: {error}");
                            127
                        }
                        Ok(mut child) => {
                            let status = tokio::select! {
                                status = child.wait() => status,
                                _ = &mut signal => {
                                    if let Some(pid) = child.id().and_then(|id| rustix::process::Pid::from_raw(id as i32)) {
                                        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
                                    }
                                    child.wait().await
                                }
                            };
                            match status {
                                Ok(status) => exit_code(status),
                                Err(error) => {
                                    eprintln!("custody-mover: waiting for {program}: {error}");
                                    1
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    write_status(dir, code)?;
    Ok(code)
}

/// The exit code of a tool stopped by SIGTERM.
const SIGTERM_EXIT: i32 = 128 + 15;

/// The FIFO's write end, once the mover has its read end open (it opens it first thing, but
/// its container may start after the tool's). A mover that ended before (a repository it
/// could not open) never reads: then this fails, naming that, instead of waiting for ever.
async fn open_for_the_mover(dir: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let fifo = dir.join(stream::FIFO);
    let mut waiting = Waiting::start();
    loop {
        // Without a reader, a non-blocking open fails at once (ENXIO) where a blocking one
        // would wait.
        match std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
            .open(&fifo)
        {
            Ok(file) => {
                // The tool's writes wait for the mover's reads.
                let flags = rustix::fs::fcntl_getfl(&file)?;
                rustix::fs::fcntl_setfl(&file, flags - rustix::fs::OFlags::NONBLOCK)?;
                return Ok(file);
            }
            Err(error) if error.raw_os_error() == Some(rustix::io::Errno::NXIO.raw_os_error()) => {}
            Err(error) => return Err(error),
        }
        if dir.join(stream::MOVER_ENDED).exists() {
            return Err(io::Error::other(
                "the mover ended before it read the stream: its log says why",
            ));
        }
        waiting.say_when_due(|seconds| {
            format!(
                "stream-tool: waiting {seconds} s for the mover to open {}",
                fifo.display()
            )
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Marks the mover's end in the stream's directory when the last copy of its
/// [`TarInput`] goes, whatever the backup's outcome ([`stream::MOVER_ENDED`]).
#[derive(Debug)]
struct MoverEnded(PathBuf);

impl Drop for MoverEnded {
    fn drop(&mut self) {
        if let Err(error) = std::fs::write(self.0.join(stream::MOVER_ENDED), b"") {
            eprintln!(
                "custody-mover: marking the mover's end in {}: {error}",
                self.0.display()
            );
        }
    }
}

fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|signal| 128 + signal))
        .unwrap_or(1)
}

fn write_status(dir: &Path, code: i32) -> io::Result<()> {
    let partial = dir.join(format!(".{}.partial", stream::STATUS));
    std::fs::write(&partial, format!("{code}\n"))?;
    std::fs::rename(&partial, dir.join(stream::STATUS))
}

/// The tool's exit code, once it wrote it.
fn read_status(dir: &Path) -> Result<Option<i32>, BuildError> {
    match std::fs::read_to_string(dir.join(stream::STATUS)) {
        Ok(text) => text.trim().parse().map(Some).map_err(|_| {
            BuildError::ToolFailed(format!(
                "the tool's exit code {:?} is not a number",
                text.trim()
            ))
        }),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(read_error(dir, error)),
    }
}

fn read_error(dir: &Path, source: io::Error) -> BuildError {
    BuildError::Read {
        path: dir.display().to_string(),
        source,
    }
}

/// Whether a read failed because the stream broke (cut short, malformed, an entry shorter
/// than its header said): the tool's doing when it also failed. Anything else (an entry the
/// mover refuses, a failed write) is the mover's own reason.
pub fn broken_stream(error: &BuildError) -> bool {
    match error {
        BuildError::Read { .. } | BuildError::Changed { .. } | BuildError::ToolFailed(_) => true,
        // The stream's own errors name the stream or an entry; the writer's name nothing.
        BuildError::Archive { path, .. } => !path.is_empty(),
        _ => false,
    }
}

/// What the tool said of itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolExit {
    Succeeded,
    Failed(i32),
}

/// Whether a tool that exited `code` wrote a backup.
pub fn tool_exit(code: i32) -> ToolExit {
    if code == 0 {
        ToolExit::Succeeded
    } else {
        ToolExit::Failed(code)
    }
}

/// The stream of a tool, in the directory it shares with the mover.
#[derive(Clone, Debug)]
pub struct TarInput {
    pub dir: PathBuf,
    /// Where the stream's entries lie in the volume; empty: its root.
    pub data_path: String,
    /// The FIFO's read end, opened by [`TarInput::connect`] when the mover starts: the tool's
    /// wrapper opens its end at once, and if the mover then fails (before reading, such as
    /// with the repository unreachable) the tool's writes fail instead of waiting for a
    /// reader that never comes.
    pub fifo: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
    /// Set by [`TarInput::connect`]: the mover's end is marked once every copy is gone.
    _ended: Option<std::sync::Arc<MoverEnded>>,
}

/// Opens the FIFO's read end without waiting for a writer.
fn open_fifo(path: &Path) -> Result<std::os::fd::OwnedFd, BuildError> {
    rustix::fs::open(
        path,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|errno| read_error(path, errno.into()))
}

impl TarInput {
    /// The stream in `dir`, its read end open from now on.
    pub fn connect(dir: PathBuf, data_path: String) -> Result<TarInput, BuildError> {
        let fifo = open_fifo(&dir.join(stream::FIFO))?;
        Ok(TarInput {
            _ended: Some(std::sync::Arc::new(MoverEnded(dir.clone()))),
            dir,
            data_path,
            fifo: Some(std::sync::Arc::new(fifo)),
        })
    }

    /// The stream, once the tool connected to it: waits (saying so every 30 s) until it
    /// wrote something or exited. `stop` (SIGTERM) ends the wait.
    pub fn open(&self, stop: &AtomicBool) -> Result<Box<dyn Read + Send>, BuildError> {
        let fifo_path = self.dir.join(stream::FIFO);
        let fifo = match &self.fifo {
            Some(fifo) => fifo
                .try_clone()
                .map_err(|error| read_error(&fifo_path, error))?,
            None => open_fifo(&fifo_path)?,
        };
        // A larger pipe: the tool writes and the mover reads in bigger runs, with fewer
        // switches between them (64 KiB by default; a refusal leaves it so).
        if let Err(errno) = rustix::pipe::fcntl_setpipe_size(&fifo, PIPE_SIZE) {
            eprintln!("custody-mover: the stream's pipe stays at its default size: {errno}");
        }
        let mut waiting = Waiting::start();
        let mut first = vec![0u8; 64 << 10];
        loop {
            if stop.load(Ordering::Relaxed) {
                return Err(BuildError::Archive {
                    path: fifo_path.display().to_string(),
                    source: io::Error::other("stopped"),
                });
            }
            match rustix::io::read(&fifo, &mut first) {
                // Data: the tool is writing.
                Ok(read) if read > 0 => {
                    first.truncate(read);
                    break;
                }
                // No writer yet, or it came and went without a byte: its exit code says which.
                Ok(_) => {
                    if let Some(code) = read_status(&self.dir)? {
                        return Err(BuildError::ToolFailed(match tool_exit(code) {
                            ToolExit::Succeeded => {
                                "the tool wrote nothing to its standard output: a stream tool writes its backup there as a tar archive (pg_basebackup -F tar -D -)".to_string()
                            }
                            ToolExit::Failed(code) => {
                                format!("the tool exited with code {code} before it wrote its stream")
                            }
                        }));
                    }
                    waiting.say_when_due(|seconds| {
                        format!(
                            "waiting {seconds} s for the tool to write its stream into {}",
                            fifo_path.display()
                        )
                    });
                    std::thread::sleep(Duration::from_millis(100));
                }
                // A writer, nothing written yet.
                Err(rustix::io::Errno::AGAIN) => {
                    first.clear();
                    break;
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(errno) => return Err(read_error(&fifo_path, errno.into())),
            }
        }
        let flags =
            rustix::fs::fcntl_getfl(&fifo).map_err(|errno| read_error(&fifo_path, errno.into()))?;
        rustix::fs::fcntl_setfl(&fifo, flags - rustix::fs::OFlags::NONBLOCK)
            .map_err(|errno| read_error(&fifo_path, errno.into()))?;
        eprintln!("custody-mover: reading the tool's tar stream");
        Ok(Box::new(io::Cursor::new(first).chain(File::from(fifo))))
    }

    /// Once the stream was read (`read`: its outcome): the tool's exit code, waited for. A
    /// stream the tool did not finish with 0 is not a backup, whatever it held; a failed
    /// read is said as the tool's failure when the tool failed (its end of the FIFO broke
    /// the stream).
    pub fn outcome<T>(
        &self,
        read: Result<T, BuildError>,
        stop: &AtomicBool,
    ) -> Result<T, BuildError> {
        let mut waiting = Waiting::start();
        let code = loop {
            if let Some(code) = read_status(&self.dir)? {
                break code;
            }
            if stop.load(Ordering::Relaxed) || waiting.elapsed() >= EXIT_AFTER_EOF {
                // The read's own failure explains more than a missing exit code.
                read?;
                return Err(BuildError::ToolFailed(format!(
                    "the tool's stream ended but its exit code was not written within {} s: the stream is not known to be whole",
                    EXIT_AFTER_EOF.as_secs()
                )));
            }
            waiting.say_when_due(|seconds| {
                format!("the stream ended {seconds} s ago; waiting for the tool to exit")
            });
            std::thread::sleep(Duration::from_millis(100));
        };
        match (tool_exit(code), read) {
            (ToolExit::Succeeded, read) => read,
            (ToolExit::Failed(code), Ok(_)) => Err(BuildError::ToolFailed(format!(
                "the tool exited with code {code} after it wrote its stream: what it wrote is not a backup"
            ))),
            // The mover refused what the stream held, or could not store it: its reason, not
            // the tool's (whose writes then failed: a broken pipe).
            (ToolExit::Failed(_), Err(error)) if !broken_stream(&error) => Err(error),
            (ToolExit::Failed(code), Err(error)) => Err(BuildError::ToolFailed(format!(
                "the tool exited with code {code} while it wrote its stream ({error})"
            ))),
        }
    }
}

#[cfg(test)]
mod tests;

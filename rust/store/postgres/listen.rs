//! `wait_events` on PostgreSQL without polling: a connection of its own `LISTEN`s on the
//! schema's channel, and every commit that locked a run sends a payload-free `NOTIFY` after it
//! (see `tx::Tx::end`). A thread of its own drives that connection and moves a [`Signal`] per
//! notification; waiters block on the signal and query the events only when it moved, so an
//! idle waiter sends the database nothing at all.
//!
//! Notifications carry no payload: what a waiter wants (a run, some types, after a `seq`) is
//! for its query to answer, and a notification only says "look again". Many commits while a
//! waiter is busy querying collapse into one more query.
//!
//! When the connection is lost the signal stops being live (waiters fall back to polling, see
//! [`Signal`]), and the thread reconnects with a growing pause; `LISTEN`ing again makes the
//! signal live and moves it, since commits in between were not announced.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio_postgres::AsyncMessage;

use super::errors::{error_text, scrub};
use super::target::Target;
use crate::errors::{LedgerError, Result};
use crate::store::Signal;

/// How long starting waits for the first `LISTEN` to be in place.
const START_TIMEOUT: Duration = Duration::from_secs(15);
/// The pauses between reconnection attempts: from the first to the longest, doubling.
const FIRST_PAUSE: Duration = Duration::from_millis(100);
const LONGEST_PAUSE: Duration = Duration::from_secs(5);

/// What reaches the listening thread: a notification or the end of the connection of session
/// `n` (a message of an earlier session is stale), or the owner's stop.
enum Msg {
    Notified(u64),
    Lost(u64),
    Stop,
}

/// The listening connection's thread, and the signal it moves. Dropping it stops the thread and
/// closes the connection.
pub(super) struct Listener {
    signal: Arc<Signal>,
    stop: UnboundedSender<Msg>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener").finish_non_exhaustive()
    }
}

impl Listener {
    /// Connect, `LISTEN`, and return once notifications are being received: a commit after
    /// this returns moves the signal. An error if the first connection or `LISTEN` fails.
    pub(super) fn start(target: &Target) -> Result<Self> {
        let signal = Arc::new(Signal::default());
        let (stop, inbox) = unbounded_channel();
        let (ready_tx, ready) = std::sync::mpsc::channel();
        let thread = {
            let (target, signal, outbox) = (target.clone(), Arc::clone(&signal), stop.clone());
            std::thread::Builder::new()
                .name("fencepost-listen".into())
                .spawn(move || listen(&target, &signal, &outbox, inbox, &ready_tx))
                .map_err(|e| start_error(&e.to_string()))?
        };
        let listener = Self {
            signal,
            stop,
            thread: Some(thread),
        };
        match ready.recv_timeout(START_TIMEOUT) {
            Ok(Ok(())) => Ok(listener),
            Ok(Err(message)) => Err(start_error(&message)),
            Err(_) => Err(start_error("the server did not answer LISTEN in time")),
        }
    }

    /// The signal waiters block on.
    pub(super) fn signal(&self) -> Arc<Signal> {
        Arc::clone(&self.signal)
    }
}

impl Drop for Listener {
    /// Stop the thread, then leave the signal not live, so a waiter still holding it falls back
    /// to the store (which says it is closed).
    fn drop(&mut self) {
        let _ = self.stop.send(Msg::Stop);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.signal.set_live(false);
    }
}

fn start_error(message: &str) -> LedgerError {
    LedgerError::StoreError {
        operation: "listening for new events".into(),
        message: format!(
            "{message}; behind a pooler in transaction mode LISTEN cannot work: open the ledger \
             with listen=False and wait_events polls instead"
        ),
    }
}

/// The thread's body: a private runtime, one listening session after another until stopped.
/// The first session's outcome goes to `ready`; a failed first session ends the thread.
fn listen(
    target: &Target,
    signal: &Signal,
    outbox: &UnboundedSender<Msg>,
    mut inbox: UnboundedReceiver<Msg>,
    ready: &std::sync::mpsc::Sender<std::result::Result<(), String>>,
) {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        let _ = ready.send(Err("could not start the listening thread's runtime".into()));
        return;
    };
    runtime.block_on(async {
        let mut first = Some(ready);
        let mut pause = FIRST_PAUSE;
        for n in 0.. {
            match session(n, target, signal, outbox, &mut inbox, &mut first).await {
                Ended::Stopped => return,
                Ended::Failed(message) => {
                    if let Some(ready) = first.take() {
                        let _ = ready.send(Err(message));
                        return;
                    }
                }
                Ended::Lost => pause = FIRST_PAUSE,
            }
            signal.set_live(false);
            // Wait before reconnecting, unless told to stop meanwhile.
            let until = tokio::time::Instant::now() + pause;
            loop {
                match tokio::time::timeout_at(until, inbox.recv()).await {
                    Ok(Some(Msg::Stop) | None) => return,
                    Ok(Some(_)) => {}
                    Err(_) => break,
                }
            }
            pause = (pause * 2).min(LONGEST_PAUSE);
        }
    });
}

/// How a listening session ended.
enum Ended {
    /// The owner dropped the listener.
    Stopped,
    /// Connecting or `LISTEN` failed (the message says why).
    Failed(String),
    /// The connection went away after it was listening.
    Lost,
}

/// One connection: `LISTEN`, then move the signal per notification until the connection ends
/// or the owner stops it.
async fn session(
    n: u64,
    target: &Target,
    signal: &Signal,
    outbox: &UnboundedSender<Msg>,
    inbox: &mut UnboundedReceiver<Msg>,
    first: &mut Option<&std::sync::mpsc::Sender<std::result::Result<(), String>>>,
) -> Ended {
    let connecting = target.config.connect(target.tls.clone());
    let (client, mut connection) = match connecting.await {
        Ok(pair) => pair,
        Err(e) => return Ended::Failed(scrub(&error_text(&e), target.password())),
    };
    // The connection is driven by a task of its own, which forwards what the server pushes.
    let forward = outbox.clone();
    let driver = tokio::spawn(async move {
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(_))) => {
                    let _ = forward.send(Msg::Notified(n));
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => {
                    let _ = forward.send(Msg::Lost(n));
                    return;
                }
            }
        }
    });
    if let Err(e) = client.batch_execute(&target.listen).await {
        driver.abort();
        return Ended::Failed(scrub(&error_text(&e), target.password()));
    }
    signal.set_live(true);
    if let Some(ready) = first.take() {
        let _ = ready.send(Ok(()));
    }
    let ended = loop {
        match inbox.recv().await {
            Some(Msg::Notified(m)) if m == n => signal.bump(),
            Some(Msg::Lost(m)) if m == n => break Ended::Lost,
            Some(Msg::Notified(_) | Msg::Lost(_)) => {}
            Some(Msg::Stop) | None => break Ended::Stopped,
        }
    };
    drop(client);
    if matches!(ended, Ended::Stopped) {
        // Let the driver send Terminate, briefly, so the server does not log an abandoned session.
        let _ = tokio::time::timeout(Duration::from_secs(1), driver).await;
    } else {
        driver.abort();
    }
    ended
}

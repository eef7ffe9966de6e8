//! The threaded engine: one loop thread owns the [`EngineCore`] (and so the model); requests
//! arrive from any thread through a channel and each gets its own event stream.

use crate::engine::batcher::{EngineConfig, EngineCore};
use crate::engine::request::{EngineStats, Event, RequestId};
use crate::engine::sampling::SamplingParams;
use crate::err;
use crate::error::Result;
use crate::model::Model;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

enum Command {
    // The parameters boxed: the other commands stay small.
    Add { id: RequestId, prompt: Vec<u32>, params: Box<SamplingParams>, events: Sender<Event>, ack: Sender<Result<()>> },
    Abort(RequestId),
    Shutdown,
}

/// A running engine (cheap to share behind an `Arc`; every method takes `&self`).
pub struct Engine {
    tx: Mutex<Sender<Command>>,
    stats: Arc<Mutex<EngineStats>>,
    next_id: AtomicU64,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// The event stream of one request.
pub struct RequestStream {
    pub id: RequestId,
    rx: Receiver<Event>,
}

impl RequestStream {
    /// The next event; `None` once the request finished (after its `Done` / `Error`).
    pub fn recv(&self) -> Option<Event> {
        self.rx.recv().ok()
    }

    /// Waits for the end of the request: every token and the final event.
    pub fn collect(&self) -> (Vec<crate::engine::request::TokenOut>, Option<Event>) {
        let mut toks = Vec::new();
        while let Some(ev) = self.recv() {
            match ev {
                Event::Token(t) => toks.push(t),
                end => return (toks, Some(end)),
            }
        }
        (toks, None)
    }
}

impl Engine {
    /// Starts the loop thread over `model`.
    ///
    /// # Errors
    /// What [`EngineCore::new`] refuses (sizes, device allocation).
    pub fn start(model: Model, cfg: EngineConfig) -> Result<Self> {
        Self::start_with_spec(model, cfg, None)
    }

    /// [`Engine::start`] with speculative decoding by MTP draft heads
    /// ([`EngineCore::with_spec`]).
    ///
    /// # Errors
    /// What [`EngineCore::with_spec`] refuses.
    pub fn start_with_spec(model: Model, cfg: EngineConfig, spec: Option<super::SpecConfig>) -> Result<Self> {
        let core = EngineCore::with_spec(Box::new(model), cfg, spec)?;
        let stats = Arc::new(Mutex::new(core.stats()));
        let (tx, rx) = mpsc::channel();
        let st = stats.clone();
        let thread = std::thread::Builder::new()
            .name("porter-engine".into())
            .spawn(move || run(core, rx, st))
            .map_err(|e| err!(Internal, "cannot start the engine thread: {e}"))?;
        Ok(Self { tx: Mutex::new(tx), stats, next_id: AtomicU64::new(1), thread: Mutex::new(Some(thread)) })
    }

    fn send(&self, c: Command) -> Result<()> {
        let tx = self.tx.lock().map_err(|_| err!(Internal, "engine channel poisoned"))?;
        tx.send(c).map_err(|_| err!(Internal, "the engine has stopped"))
    }

    /// Queues a request; its events arrive on the returned stream.
    ///
    /// # Errors
    /// What [`EngineCore::add_request`] refuses, reported before anything runs.
    pub fn add(&self, prompt: Vec<u32>, params: SamplingParams) -> Result<RequestStream> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (etx, erx) = mpsc::channel();
        let (atx, arx) = mpsc::channel();
        self.send(Command::Add { id, prompt, params: Box::new(params), events: etx, ack: atx })?;
        arx.recv().map_err(|_| err!(Internal, "the engine stopped before admitting the request"))??;
        Ok(RequestStream { id, rx: erx })
    }

    /// Aborts a request (a no-op for a finished one); its stream ends with `Done(abort)`.
    pub fn abort(&self, id: RequestId) -> Result<()> {
        self.send(Command::Abort(id))
    }

    /// Counters, as of the last step.
    pub fn stats(&self) -> EngineStats {
        self.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Stops the loop (running requests end with `Done(abort)`) and joins it.
    pub fn shutdown(&self) {
        let _ = self.send(Command::Shutdown);
        if let Ok(mut t) = self.thread.lock() {
            if let Some(t) = t.take() {
                let _ = t.join();
            }
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The loop: take commands (blocking when idle), run a step, route the events.
fn run(mut core: EngineCore<Box<Model>>, rx: Receiver<Command>, stats: Arc<Mutex<EngineStats>>) {
    let mut streams: std::collections::HashMap<RequestId, Sender<Event>> = Default::default();
    let publish = |core: &EngineCore<Box<Model>>| {
        if let Ok(mut s) = stats.lock() {
            *s = core.stats();
        }
    };
    loop {
        // Block for the first command when there is nothing to run.
        let first = if core.has_work() { rx.try_recv().ok() } else { rx.recv().ok().or(Some(Command::Shutdown)) };
        let mut cmds: Vec<Command> = first.into_iter().collect();
        cmds.extend(rx.try_iter());
        for c in cmds {
            match c {
                Command::Add { id, prompt, params, events, ack } => {
                    let r = core.add_request(id, prompt, *params);
                    if r.is_ok() {
                        streams.insert(id, events);
                    }
                    let _ = ack.send(r);
                }
                Command::Abort(id) => {
                    if let Ok(Some(ev)) = core.abort(id) {
                        // Counters first: whoever sees the end sees the freed blocks.
                        publish(&core);
                        if let Some(tx) = streams.remove(&id) {
                            let _ = tx.send(ev);
                        }
                    }
                }
                Command::Shutdown => {
                    let ids: Vec<RequestId> = streams.keys().copied().collect();
                    for id in ids {
                        if let Ok(Some(ev)) = core.abort(id) {
                            if let Some(tx) = streams.remove(&id) {
                                let _ = tx.send(ev);
                            }
                        }
                    }
                    publish(&core);
                    return;
                }
            }
        }
        if !core.has_work() {
            publish(&core);
            continue;
        }
        let events = match core.step() {
            Ok(ev) => ev,
            Err(e) => core.fail_running(&e.to_string()),
        };
        publish(&core);
        for (id, ev) in events {
            let end = ev.is_end();
            let gone = match streams.get(&id) {
                Some(tx) => tx.send(ev).is_err(),
                None => false,
            };
            if end {
                streams.remove(&id);
            } else if gone {
                // The receiver went away: abort, nobody is listening.
                streams.remove(&id);
                let _ = core.abort(id);
                publish(&core);
            }
        }
    }
}

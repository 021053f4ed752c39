//! The GPU's power draw and SM clock through a timed run, for the benches whose steps run at the
//! GPU's power limit (`bench llama -- --power`): `nvidia-smi` sampled every 50 ms on a thread of
//! its own, each sample stamped as it arrives, and the samples of a run's timed window averaged.
//! At the limit a step's time is about its energy over the power the GPU holds, so the two
//! figures beside the time (watts, and joules per step) say which of the two moved.
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

/// The fields asked of `nvidia-smi`: the instantaneous draw where the driver reports it (the
/// default `power.draw` is a one-second average on recent drivers), else `power.draw`.
const FIELDS: [&str; 2] = ["clocks.sm,power.draw.instant", "clocks.sm,power.draw"];

/// One sample: when it arrived, the SM clock (MHz) and the board's draw (W).
type Sample = (Instant, f64, f64);

/// `nvidia-smi` sampling GPU `gpu` until dropped.
pub struct Sampler {
    child: Child,
    samples: Arc<Mutex<Vec<Sample>>>,
    reader: Option<JoinHandle<()>>,
}

/// The mean of the samples in a window.
#[derive(Debug, Clone, Copy)]
pub struct Reading {
    pub watts: f64,
    pub mhz: f64,
}

impl Sampler {
    /// Starts sampling; why not where `nvidia-smi` cannot run or reports neither field set.
    pub fn start(gpu: usize) -> Result<Sampler, String> {
        let fields = FIELDS
            .iter()
            .find(|f| {
                let probe = Command::new("nvidia-smi")
                    .args([&format!("--query-gpu={f}"), "--format=csv,noheader,nounits", "-i", &gpu.to_string()])
                    .output();
                probe.is_ok_and(|o| o.status.success())
            })
            .ok_or("nvidia-smi does not run, or reports neither power.draw.instant nor power.draw")?;
        let mut child = Command::new("nvidia-smi")
            .args([&format!("--query-gpu={fields}"), "--format=csv,noheader,nounits", "-lms", "50", "-i"])
            .arg(gpu.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("nvidia-smi: {e}"))?;
        let stdout = child.stdout.take().ok_or("nvidia-smi: no standard output")?;
        let samples = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&samples);
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
                let v: Vec<f64> = line.split(',').filter_map(|x| x.trim().parse().ok()).collect();
                if let [mhz, watts] = v[..] {
                    sink.lock().unwrap_or_else(|p| p.into_inner()).push((Instant::now(), mhz, watts));
                }
            }
        });
        Ok(Sampler { child, samples, reader: Some(reader) })
    }

    /// The mean draw and clock of the samples that arrived between `from` and `to`; None where
    /// none did.
    pub fn over(&self, from: Instant, to: Instant) -> Option<Reading> {
        let samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        let inside: Vec<&Sample> = samples.iter().filter(|s| s.0 >= from && s.0 <= to).collect();
        let n = inside.len();
        (n > 0).then(|| Reading {
            watts: inside.iter().map(|s| s.2).sum::<f64>() / n as f64,
            mhz: inside.iter().map(|s| s.1).sum::<f64>() / n as f64,
        })
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

//! `cairn-server`: one staging server, for launchers without Python (`mpirun`, `srun`, the C
//! API's embedded cluster). Same flags as `cairn serve`.

use cairn_server::{serve, Limits, ServeOptions};
use std::path::PathBuf;
use std::time::Duration;

const USAGE: &str = "usage: cairn-server --cluster FILE [--id N] [--servers N] [--spares N] [--memory SIZE] [--host ADDR]
                    [--node NAME] [--rack NAME] [--timeout S] [--io-timeout S] [--hello-timeout S] [--peer-timeout S]
                    [--meta M] [--redundancy R] [--scheme corec|replicate|erasure|hybrid|none] [--rs-data K]
                    [--min-efficiency S] [--hot-steps W] [--failure-timeout DURATION]
                    [--recovery lazy|aggressive] [--recovery-deadline DURATION] [--recovery-rate SIZE]
                    [--mtbf DURATION] [--same-node-other-users true|false]
The id defaults to the MPI/Slurm rank; --host defaults to 127.0.0.1 (0.0.0.0 listens on every interface);
--meta (1 to 5, default 3) servers run the control plane's Raft replicas. Variables survive --redundancy
server failures unless they say otherwise (default 1, lowered to servers - 1); cold objects are coded RS(K + R).
A server the control plane's leader has not heard from for --failure-timeout (default 3s) is declared down
and a spare takes its slot; its objects are rebuilt there within --recovery-deadline (default a quarter of
--mtbf when given, else 60s; lazy) or at once (aggressive), sending at most --recovery-rate bytes per second
(default 256MiB; 0: no limit).";

fn main() {
    if let Err(e) = run() {
        eprintln!("cairn-server: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let rank = ["OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"].iter().find_map(|k| std::env::var(k).ok()?.parse().ok());
    let mut opts = ServeOptions {
        cluster: PathBuf::from("cluster.json"),
        id: rank.unwrap_or(0),
        servers: 1,
        spares: 0,
        memory: 4 << 30,
        bind: "127.0.0.1".into(),
        node: String::new(),
        rack: String::new(),
        timeout: Duration::from_secs(120),
        limits: Limits::default(),
        meta: 3,
        redundancy: cairn_core::corec::Policy { redundancy: 1, ..Default::default() },
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "-h" || flag == "--help" {
            println!("{USAGE}");
            return Ok(());
        }
        let value = args.next().ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let num = |what: &str| value.parse::<u32>().map_err(|_| format!("{flag} {value:?}: expected {what}"));
        let secs = || {
            value
                .parse::<f64>()
                .ok()
                .and_then(|s| Duration::try_from_secs_f64(s).ok())
                .filter(|d| !d.is_zero())
                .ok_or_else(|| format!("{flag} {value:?}: expected a positive number of seconds"))
        };
        match flag.as_str() {
            "--cluster" => opts.cluster = PathBuf::from(&value),
            "--id" => opts.id = num("a server id")?,
            "--servers" => opts.servers = num("a server count")?,
            "--spares" => opts.spares = num("a spare count")?,
            "--memory" => opts.memory = cairn_proto::cluster::parse_size(&value).map_err(|e| e.to_string())?,
            "--host" | "--bind" => opts.bind = value,
            "--node" => opts.node = value,
            "--rack" => opts.rack = value,
            "--timeout" => opts.timeout = secs()?,
            "--io-timeout" => opts.limits.io_timeout = secs()?,
            "--hello-timeout" => opts.limits.hello_timeout = secs()?,
            "--peer-timeout" => opts.limits.peer_timeout = secs()?,
            "--recovery" | "--recovery-deadline" | "--recovery-rate" | "--failure-timeout" | "--mtbf" | "--same-node-other-users" => {
                opts.limits.set(&flag[2..].replace('-', "_"), &value).map_err(|e| format!("{flag}: {e}"))?
            }
            "--meta" => opts.meta = num("a meta server count")?.clamp(1, 5),
            "--redundancy" => opts.redundancy.redundancy = num("a number of server failures")?,
            "--scheme" => opts.redundancy.scheme = cairn_core::corec::Scheme::parse(&value).map_err(|e| e.to_string())?,
            "--rs-data" => opts.redundancy.rs_data = num("a number of data shards")?,
            "--min-efficiency" => {
                opts.redundancy.min_efficiency = value.parse().map_err(|_| format!("{flag} {value:?}: expected a fraction, e.g. 0.6"))?
            }
            "--hot-steps" => opts.redundancy.hot_steps = num("a step count")?,
            _ => return Err(format!("unknown flag {flag}\n{USAGE}")),
        }
    }
    opts.cluster = std::path::absolute(&opts.cluster).map_err(|e| format!("cluster file {}: {e}", opts.cluster.display()))?;
    serve(opts).map_err(|e| e.to_string())
}

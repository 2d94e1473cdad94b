//! A job launched the way srun launches it: 3 real processes of tc-perf
//! (no tc-run, no torchrun) that get only Slurm's variables: rank, size and
//! local rank from SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID, the store at
//! the first host of SLURM_STEP_NODELIST on the port derived from
//! SLURM_JOB_ID + SLURM_STEP_ID (task 0 hosts it).

use std::net::TcpListener;
use std::process::{Command, Stdio};

/// A SLURM_JOB_ID whose derived port (10000 + job % 50000) is free now.
fn job_id_with_a_free_port() -> u16 {
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if (10000..60000).contains(&port) {
            return port - 10000;
        }
    }
}

#[test]
fn three_tasks_bootstrap_from_slurm_variables_alone() {
    if let Err(e) = torchcomm::backend_available("gloo") {
        println!("SKIPPED: the gloo module is unavailable: {}", e.message);
        return;
    }
    let perf = env!("CARGO_BIN_EXE_tc-perf");
    let job = job_id_with_a_free_port().to_string();
    let children: Vec<_> = (0..3)
        .map(|task| {
            let mut cmd = Command::new(perf);
            cmd.args([
                "-b",
                "64",
                "-e",
                "64",
                "-n",
                "1",
                "-w",
                "0",
                "-o",
                "all_reduce",
                "-B",
                "gloo",
            ]);
            for v in torchcomm::RANK_VARS
                .iter()
                .chain(&torchcomm::SIZE_VARS)
                .chain(&torchcomm::LOCAL_RANK_VARS)
                .chain(&["MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE"])
            {
                cmd.env_remove(v);
            }
            cmd.env("SLURM_PROCID", task.to_string())
                .env("SLURM_NTASKS", "3")
                .env("SLURM_LOCALID", task.to_string())
                .env("SLURM_STEP_NODELIST", "localhost,node[2-3]")
                .env("SLURM_LAUNCH_NODE_IPADDR", "192.0.2.1") // unused: the nodelist wins
                .env("SLURM_JOB_ID", &job)
                .env("SLURM_STEP_ID", "0")
                .env("TORCHCOMM_TIMEOUT_SECONDS", "120")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            cmd.spawn().expect("spawning tc-perf")
        })
        .collect();
    let outputs: Vec<_> = children
        .into_iter()
        .map(|c| c.wait_with_output().expect("waiting for tc-perf"))
        .collect();
    let all: String = outputs
        .iter()
        .enumerate()
        .map(|(i, o)| {
            format!(
                "--- task {i}: {:?}\n{}{}",
                o.status,
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            )
        })
        .collect();
    assert!(outputs.iter().all(|o| o.status.success()), "{all}");
    let rank0 = String::from_utf8_lossy(&outputs[0].stdout);
    assert!(rank0.contains("3 ranks"), "{all}");
    assert!(rank0.contains("Out of bounds values : 0 OK"), "{all}");
}

//! `cairn-server`: one staging server, for launchers without Python (`mpirun`, `srun`, the C
//! API's embedded cluster). Same flags as `cairn serve` ([`cairn_server::settings`]).

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match cairn_server::ServeOptions::parse([], &args) {
        Ok(None) => println!("{}", cairn_server::settings::USAGE),
        Ok(Some(opts)) => {
            if let Err(e) = cairn_server::serve(opts) {
                eprintln!("cairn-server: {e}");
                std::process::exit(1);
            }
        }
        Err(e) => {
            eprintln!("cairn-server: {e}");
            std::process::exit(2);
        }
    }
}

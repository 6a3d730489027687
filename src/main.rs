use clap::Parser;

fn main() {
    let cli = idemgate::cli::Cli::parse();
    idemgate::cli::init_logging(cli.log_format);
    let code = idemgate::cli::run(cli);
    idemgate::cli::flush_logs();
    std::process::exit(code);
}

use clap::Parser;

fn main() {
    let cli = idemgate::cli::Cli::parse();
    idemgate::cli::init_logging(cli.log_format);
    std::process::exit(idemgate::cli::run(cli));
}

fn main() {
    std::process::exit(ringtrain::cli::main());
}

//! What every example's command line shares: `--help` prints the usage and exits 0, a wrong
//! argument prints the error and the usage and exits 2.

/// The parsed arguments; or, for `--help` (`Ok(None)`) or a wrong argument, the process ends as
/// described above. `name` prefixes the error.
pub fn args_or_exit<A, E: std::fmt::Display>(name: &str, usage: &str, parsed: Result<Option<A>, E>) -> A {
    match parsed {
        Ok(Some(args)) => args,
        Ok(None) => {
            println!("{usage}");
            std::process::exit(0);
        }
        Err(e) => {
            eprintln!("{name}: {e}\n{usage}");
            std::process::exit(2);
        }
    }
}

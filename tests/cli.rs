// CLI tests

// placeholder entry point; the command dispatcher replaces it
int main() { return 0; }
